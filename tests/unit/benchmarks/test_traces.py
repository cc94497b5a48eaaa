"""benchmarks.workloads.traces: every bundled trace parses sanely, bad rows are reported rather than raised,
and the shaping helpers (window, scale_rate, poisson_arrivals, limit) keep programs whole."""

from __future__ import annotations

import json
import math
import statistics
from functools import cache
from pathlib import Path

import pytest

from benchmarks.workloads import traces
from benchmarks.workloads.traces import (
    TraceLoad,
    TraceRequest,
    available_traces,
    limit,
    load,
    load_azure,
    load_deepresearch,
    load_mooncake,
    load_tracelab_rounds,
    load_tracelab_sessions,
    poisson_arrivals,
    programs,
    resolve_data_dir,
    scale_rate,
    window,
)

REPO = Path(__file__).resolve().parents[3]
DATA = resolve_data_dir()

# Row counts from the datasets' READMEs; the files are pinned by shared/data/SHA256SUMS.
EXPECTED = {
    "azure-code": 8819,
    "azure-conv": 19366,
    "mooncake-conversation": 12031,
    "mooncake-synthetic": 3993,
    "deepresearch": 2294,
    "tracelab-rounds": 19,
    "tracelab-sessions": 303,
}
# Last arrival (s) from the READMEs' time spans.
SPAN_S = {"azure-code": 3435.9, "azure-conv": 3501.7, "mooncake-conversation": 3537.0, "mooncake-synthetic": 1022.0}
DAG_TRACES = {"deepresearch", "tracelab-rounds", "tracelab-sessions"}


@cache
def _bundled(name: str) -> TraceLoad:
    return load(name)


def _need(name: str) -> None:
    if name not in available_traces():
        pytest.skip(f"trace {name!r} not present under {DATA} (set $SGLANG_SLO_DATA to the shared data dir)")


def _req(rid: str, t: float, p: int = 10, o: int = 5, program: str | None = None, stage: int | None = None, **kw):
    return TraceRequest(arrival_s=t, prompt_tokens=p, output_tokens=o, program_id=program, stage=stage, rid=rid, **kw)


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------
# Data directory and registry


def test_data_dir_precedence(monkeypatch, tmp_path):
    monkeypatch.delenv(traces.DATA_ENV, raising=False)
    assert resolve_data_dir() == REPO.parent / "shared" / "data"
    monkeypatch.setenv(traces.DATA_ENV, str(tmp_path / "env"))
    assert resolve_data_dir() == tmp_path / "env"
    assert resolve_data_dir(tmp_path / "arg") == tmp_path / "arg"


def test_available_traces_lists_only_present_files(monkeypatch, tmp_path):
    (tmp_path / "mooncake").mkdir()
    _write(
        tmp_path / "mooncake" / "synthetic_trace.jsonl",
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n',
    )
    assert available_traces(tmp_path) == {"mooncake-synthetic": tmp_path / "mooncake" / "synthetic_trace.jsonl"}
    monkeypatch.setenv(traces.DATA_ENV, str(tmp_path))
    assert [r.rid for r in load("mooncake-synthetic").requests] == ["synthetic_trace:1"]
    with pytest.raises(FileNotFoundError, match="azure-code"):
        load("azure-code")
    with pytest.raises(KeyError, match="unknown trace"):
        load("burstgpt", tmp_path)


# --------------------------------------------------------------------------------------------
# The bundled traces


def test_every_registered_trace_is_bundled():
    if not DATA.is_dir():
        pytest.skip(f"data dir {DATA} absent (set $SGLANG_SLO_DATA)")
    assert set(available_traces()) == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_bundled_trace_is_sane(name):
    _need(name)
    result = _bundled(name)
    reqs = result.requests
    assert result.bad_rows == []
    assert len(reqs) == EXPECTED[name]
    arrivals = [r.arrival_s for r in reqs]
    assert arrivals[0] == 0.0
    assert all(math.isfinite(a) and a >= 0 for a in arrivals)
    assert all(a <= b for a, b in zip(arrivals, arrivals[1:]))
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in reqs)
    assert all(0 <= r.prefix_tokens < r.prompt_tokens and r.think_s >= 0 for r in reqs)
    assert len({r.rid for r in reqs}) == len(reqs)
    if name in SPAN_S:
        assert arrivals[-1] == pytest.approx(SPAN_S[name], abs=0.1)
    if name in DAG_TRACES:
        assert all(r.program_id is not None and r.stage is not None for r in reqs)
        by_rid = {r.rid: r for r in reqs}
        first_stage = {p: min(r.stage for r in rs) for p, rs in programs(reqs).items()}
        for r in reqs:
            assert all(by_rid[p].program_id == r.program_id and by_rid[p].stage < r.stage for p in r.parents)
            assert (r.parents == ()) == (r.stage == first_stage[r.program_id])
    else:
        assert all(r.program_id is None and r.parents == () for r in reqs)


@pytest.mark.parametrize("name", ["mooncake-conversation", "mooncake-synthetic"])
def test_mooncake_hash_ids_cover_the_prompt_in_512_token_blocks(name):
    _need(name)
    reqs = _bundled(name).requests
    assert all(len(r.prefix_hash_ids) == -(-r.prompt_tokens // 512) for r in reqs)
    # Prefix reuse is the point of this trace: many requests share their first block with an earlier one
    # (all but one in the conversation trace, ~45% in the synthetic one).
    firsts = [r.prefix_hash_ids[0] for r in reqs]
    assert len(firsts) - len(set(firsts)) > 0.3 * len(firsts)


def test_azure_first_rows_match_readme():
    _need("azure-code")
    first, second = _bundled("azure-code").requests[:2]
    assert (first.prompt_tokens, first.output_tokens, second.prompt_tokens, second.output_tokens) == (4808, 10, 3180, 8)
    assert second.arrival_s == pytest.approx(0.052, abs=1e-9)  # 18:17:04.0319600 - 18:17:03.9799600


def test_deepresearch_parents_are_the_whole_previous_stage():
    _need("deepresearch")
    reqs = _bundled("deepresearch").requests
    progs = programs(reqs)
    assert len(progs) == 394
    assert sorted({len({r.stage for r in p}) for p in progs.values()}) == [4, 6]
    for prog in progs.values():
        stages: dict[int, list[str]] = {}
        for r in prog:
            stages.setdefault(r.stage, []).append(r.rid)
        assert sorted(stages) == list(range(len(stages)))
        assert len({r.arrival_s for r in prog}) == 1
        for r in prog:
            assert set(r.parents) == (set(stages[r.stage - 1]) if r.stage else set())
    fan_out = max(len(r.parents) for r in reqs)
    assert fan_out == 5  # the one 5-call stage, per the README


def test_deepresearch_max_rows_counts_jobs():
    _need("deepresearch")
    part = load("deepresearch", max_rows=3)
    assert sorted(programs(part.requests)) == ["dr1", "dr2", "dr3"]
    assert [r.arrival_s for r in part.requests if r.stage == 0] == [0.0, 1.0, 2.0]


def test_tracelab_sessions_prompt_is_prefix_plus_input_and_chains_rounds():
    _need("tracelab-sessions")
    progs = programs(_bundled("tracelab-sessions").requests)
    assert len(progs) == 48
    for rounds in progs.values():
        for prev, cur in zip(rounds, rounds[1:]):
            assert cur.parents == (prev.rid,)
            # "cumulative-consistent prefixes": a round's prefix is the previous round's full context
            assert cur.prefix_tokens == prev.prompt_tokens + prev.output_tokens


def test_tracelab_rounds_think_time_from_timing_events():
    _need("tracelab-rounds")
    reqs = _bundled("tracelab-rounds").requests
    assert sorted(len(p) for p in programs(reqs).values()) == [9, 10]
    claude = programs(reqs)["claude:92ee5b8a-429c-e80b-5db6-5381512f4697"]
    # Round 0's last event is a tool_call at 05:40:31.647; round 1 starts on its last tool_result, 05:40:50.938.
    assert claude[1].think_s == pytest.approx(19.291, abs=1e-6)
    assert (claude[0].prompt_tokens, claude[0].prefix_tokens, claude[0].output_tokens) == (32272, 27217, 931)


def test_max_rows_streams_a_prefix():
    _need("azure-conv")
    part = load("azure-conv", max_rows=100)
    assert [r.rid for r in part.requests] == [r.rid for r in _bundled("azure-conv").requests[:100]]


# --------------------------------------------------------------------------------------------
# Bad rows are reported, never raised


def test_azure_bad_rows(tmp_path):
    path = _write(
        tmp_path / "az.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "yesterday,10,1\n"  # 2
        "2023-11-16 18:00:01.5000000,100,7\n"  # 3
        "2023-11-16 18:00:02.0000000,,7\n"  # 4
        "2023-11-16 18:00:02.0000000,-5,7\n"  # 5
        "2023-11-16 18:00:02.0000000,abc,7\n"  # 6
        "2023-13-45 18:00:02.0000000,10,7\n"  # 7
        "2023-11-16 18:00:03.2500001,200,0\n"  # 8
        "2023-11-16 18:00:04.0000000,10,2.5\n"  # 9
        "2023-11-16 18:00:04.0000000,10,3,9\n"  # 10
        "2023-11-16 18:00:04.0000000,0,3\n"  # 11
        "2023-11-16 18:00:04.0000000,10",  # 12: short row, no trailing newline
    )
    result = load_azure(path)
    assert [(r.rid, r.prompt_tokens, r.output_tokens) for r in result.requests] == [("az:3", 100, 7), ("az:8", 200, 0)]
    # re-based to the earliest *valid* row, exact to the 7th fractional digit
    assert [r.arrival_s for r in result.requests] == [0.0, pytest.approx(1.7500001, abs=1e-9)]
    reasons = dict(result.bad_rows)
    assert sorted(reasons) == [2, 4, 5, 6, 7, 9, 10, 11, 12]
    assert "unparsable TIMESTAMP" in reasons[2] and "unparsable TIMESTAMP" in reasons[7]
    assert reasons[4] == "missing ContextTokens"
    assert "negative" in reasons[5] and "not a number" in reasons[6] and "not an integer" in reasons[9]
    assert "extra fields" in reasons[10] and reasons[11] == "ContextTokens is zero"
    assert reasons[12] == "missing GeneratedTokens"


def test_csv_missing_column_is_one_bad_row(tmp_path):
    path = _write(tmp_path / "az.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:00:01,10\n")
    result = load_azure(path)
    assert result.requests == [] and result.bad_rows == [(1, "header lacks column(s) GeneratedTokens")]


def test_mooncake_bad_rows(tmp_path):
    lines = [
        '{"timestamp": 500, "input_length": 600, "output_length": 3, "hash_ids": [0, 1]}',
        "{not json",
        '{"timestamp": 700, "input_length": 10, "output_length": 3, "hash_ids": 4}',
        '{"timestamp": 700, "input_length": 10, "output_length": 3, "hash_ids": [0, "x"]}',
        '{"input_length": 10, "output_length": 3, "hash_ids": []}',
        '{"timestamp": 800, "input_length": 10, "output_length": -1, "hash_ids": [0]}',
        '{"timestamp": 800, "input_length": true, "output_length": 1, "hash_ids": [0]}',
        "[1, 2]",
        "",
        '{"timestamp": 1750.0, "input_length": 10.0, "output_length": 1, "hash_ids": [0]}',
    ]
    result = load_mooncake(_write(tmp_path / "mc.jsonl", "\n".join(lines) + "\n"))
    assert [(r.rid, r.arrival_s, r.prompt_tokens, r.prefix_hash_ids) for r in result.requests] == [
        ("mc:1", 0.0, 600, (0, 1)),
        ("mc:10", 1.25, 10, (0,)),
    ]
    reasons = dict(result.bad_rows)
    assert sorted(reasons) == [2, 3, 4, 5, 6, 7, 8]  # the blank line 9 is not a row
    assert reasons[2].startswith("invalid JSON") and "not a list" in reasons[3]
    assert "hash_ids[] is not a number" in reasons[4] and reasons[5] == "missing timestamp"
    assert "output_length is negative" in reasons[6] and "input_length is not a number" in reasons[7]
    assert reasons[8] == "not a JSON object"


def test_deepresearch_bad_call_is_reported_and_next_stage_depends_on_the_rest(tmp_path):
    def call(i, o):
        return {"input_tokens": i, "output_tokens": o, "total_tokens": i + o}

    jobs = [
        {
            "request_id": 7,
            "stages": [
                {"stage_number": 0, "requests": [call(100, 10)]},
                {"stage_number": 1, "requests": [call(50, 5), {"input_tokens": 50, "output_tokens": -5}, call(60, 6)]},
                {"stage_number": 2, "requests": [{"input_tokens": 9, "output_tokens": 1, "total_tokens": 99}]},
                {"stage_number": 3, "requests": [call(70, 7)]},
            ],
        },
        {"request_id": 8},
        {"request_id": 9, "stages": [{"stage_number": 0, "requests": [call(1, 1)]}]},
    ]
    result = load_deepresearch(_write(tmp_path / "dr.json", json.dumps(jobs)), interval_s=2.5)
    by_rid = {r.rid: r for r in result.requests}
    assert sorted(by_rid) == ["dr7.s0.c0", "dr7.s1.c0", "dr7.s1.c2", "dr7.s3.c0", "dr9.s0.c0"]
    assert by_rid["dr7.s1.c2"].parents == ("dr7.s0.c0",)
    # stage 2 lost its only call, so stage 3 waits for what is left of stage 1
    assert by_rid["dr7.s3.c0"].parents == ("dr7.s1.c0", "dr7.s1.c2")
    assert by_rid["dr9.s0.c0"].arrival_s == 2.5  # the second *kept* job
    reasons = dict(result.bad_rows)
    assert set(reasons) == {"dr7.s1.c1", "dr7.s2.c0", "job[1]"}
    assert "output_tokens is negative" in reasons["dr7.s1.c1"] and "total_tokens 99" in reasons["dr7.s2.c0"]
    assert reasons["job[1]"] == "stages missing or empty"


def test_deepresearch_unreadable_file_is_a_bad_row(tmp_path):
    result = load_deepresearch(_write(tmp_path / "dr.json", '{"request_id": 1'))
    assert result.requests == [] and result.bad_rows[0][0] == "file"


def _round(session: str, index: int, events: list[tuple[str, str]], prompt=100, prefix=40, output=9) -> str:
    return json.dumps(
        {
            "session_id": session,
            "round_index": index,
            "input_tokens_total": prompt,
            "prefix_tokens": prefix,
            "output_tokens": output,
            "timing_events": [{"event_type": e, "timestamp": t} for e, t in events],
        }
    )


def test_tracelab_rounds_think_time_and_bad_rounds(tmp_path):
    lines = [
        _round("a", 0, [("user_message", "2026-01-01T00:00:00.000Z"), ("tool_call", "2026-01-01T00:00:02.000Z")]),
        _round("b", 0, [("user_message", "2026-02-01T00:00:00Z")]),
        # parallel tool results: the call goes out on the last one (00:00:07), 5 s after round 0 ended
        _round(
            "a",
            1,
            [
                ("tool_result", "2026-01-01T00:00:03.000Z"),
                ("tool_result", "2026-01-01T00:00:07.000Z"),
                ("text", "2026-01-01T00:00:09.500Z"),
            ],
        ),
        _round("a", 2, [("tool_result", "last tuesday")]),
        _round("a", 3, [("user_message", "2026-01-01T00:00:10.000Z")], prompt=50, prefix=60),
        _round("a", 4, [("user_message", "2026-01-01T00:00:12.000Z")]),
        _round("a", 5, []),
    ]
    result = load_tracelab_rounds(_write(tmp_path / "rt.jsonl", "\n".join(lines)))
    a = programs(result.requests)["a"]
    assert [(r.stage, r.parents, r.think_s) for r in a] == [
        (0, (), 0.0),
        (1, ("a#0",), pytest.approx(5.0)),
        (4, ("a#1",), pytest.approx(2.5)),  # rounds 2 and 3 were bad: round 4 follows round 1 (ended 00:00:09.5)
    ]
    assert programs(result.requests)["b"][0].arrival_s == 0.0 == a[0].arrival_s
    reasons = dict(result.bad_rows)
    assert sorted(reasons) == [4, 5, 7]
    assert "unparsable timestamp" in reasons[4] and "prefix_tokens 60 > input_tokens_total 50" in reasons[5]
    assert reasons[7] == "timing_events missing or empty"


def test_tracelab_sessions_small_file(tmp_path):
    path = _write(
        tmp_path / "ms.csv",
        "session_id,arrival_time,round_idx,prefix_len,input_len,output_len,tool_wait_after_ms\n"
        "1,1500,0,0,100,20,300\n"  # 2
        "1,1500,1,120,30,5,0\n"  # 3
        "0,500,1,250,10,4,0\n"  # 4: out of order in the file
        "0,500,0,0,200,50,1250\n"  # 5
        "2,900,0,0,x,5,0\n"  # 6
        "2,900,0,0,10,5,-1\n"  # 7
        "0,500,1,250,10,4,0\n",  # 8: duplicate round
    )
    result = load_tracelab_sessions(path)
    got = [(r.rid, r.arrival_s, r.prompt_tokens, r.prefix_tokens, r.parents, r.think_s) for r in result.requests]
    assert got == [
        ("s0#0", 0.0, 200, 0, (), 0.0),
        ("s0#1", 0.0, 260, 250, ("s0#0",), 1.25),
        ("s1#0", 1.0, 100, 0, (), 0.0),
        ("s1#1", 1.0, 150, 120, ("s1#0",), 0.3),
    ]
    reasons = dict(result.bad_rows)
    assert sorted(reasons) == [6, 7, 8]
    assert "input_len is not a number" in reasons[6] and "tool_wait_after_ms is negative" in reasons[7]
    assert "duplicate round 1" in reasons[8]


def test_negative_max_rows_is_an_error(tmp_path):
    with pytest.raises(ValueError):
        load_mooncake(_write(tmp_path / "mc.jsonl", ""), max_rows=-1)


# --------------------------------------------------------------------------------------------
# Shaping


FLAT = [_req(f"r{i}", float(i), p=100 + i) for i in range(5)]  # arrivals 0..4
# p1 starts at 0.5 (stages at 0.5, 0.5, 3.5); p2 starts at 2.5 (before the window below) with a stage at 3.0
DAG = [
    _req("p1a", 0.5, program="p1", stage=0),
    _req("p1b", 0.5, program="p1", stage=1, parents=("p1a",)),
    _req("p2a", 2.5, program="p2", stage=0),
    _req("p2b", 3.0, program="p2", stage=1, parents=("p2a",)),
    _req("p1c", 3.5, program="p1", stage=2, parents=("p1b",)),
    _req("p3a", 4.0, program="p3", stage=0),
]


def test_window_rebases_to_start_and_is_half_open():
    got = window(FLAT, 1.0, 3.0)
    assert [(r.rid, r.arrival_s) for r in got] == [("r1", 0.0), ("r2", 1.0)]
    assert window(FLAT, 4.5, 9.0) == []
    with pytest.raises(ValueError):
        window(FLAT, 3.0, 1.0)


def test_window_keeps_programs_whole_by_first_stage():
    got = window(DAG, 0.0, 2.6)
    # p1's first stage is inside, so its late stage (3.5) comes too; p2 starts at 2.5 < 2.6 so it is in too
    assert sorted(r.rid for r in got) == ["p1a", "p1b", "p1c", "p2a", "p2b"]
    got = window(DAG, 1.0, 5.0)
    # p1 started before the window: all of it is out, including p1c at 3.5
    assert [(r.rid, r.arrival_s) for r in got] == [("p2a", 1.5), ("p2b", 2.0), ("p3a", 3.0)]


def test_scale_rate():
    got = scale_rate(FLAT + [_req("t", 8.0, think_s=1.5)], 2.0)
    assert [r.arrival_s for r in got] == [0.0, 0.5, 1.0, 1.5, 2.0, 4.0]
    assert got[-1].think_s == 1.5  # tool time is not load
    assert [r.arrival_s for r in scale_rate(FLAT, 0.5)] == [0.0, 2.0, 4.0, 6.0, 8.0]
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError):
            scale_rate(FLAT, bad)


def test_poisson_arrivals_seeded_and_keeps_length_order():
    reqs = [_req(f"r{i}", 10.0 * i, p=1 + (i * 37) % 101) for i in range(4000)]
    a = poisson_arrivals(reqs, rate=5.0, seed=3)
    assert [r.arrival_s for r in a] == [r.arrival_s for r in poisson_arrivals(reqs, rate=5.0, seed=3)]
    assert [r.arrival_s for r in a] != [r.arrival_s for r in poisson_arrivals(reqs, rate=5.0, seed=4)]
    assert [r.rid for r in a] == [r.rid for r in reqs] and [r.prompt_tokens for r in a] == [
        r.prompt_tokens for r in reqs
    ]
    gaps = [y.arrival_s - x.arrival_s for x, y in zip(a, a[1:])]
    assert a[0].arrival_s == 0.0 and min(gaps) > 0
    assert statistics.fmean(gaps) == pytest.approx(1 / 5.0, rel=0.05)
    # exponential gaps: the standard deviation equals the mean
    assert statistics.pstdev(gaps) == pytest.approx(1 / 5.0, rel=0.1)
    with pytest.raises(ValueError):
        poisson_arrivals(reqs, rate=0.0)


def test_poisson_arrivals_moves_programs_as_units():
    got = poisson_arrivals(DAG, rate=1.0, seed=0)
    assert len(got) == len(DAG)
    progs = programs(got)
    starts = [min(r.arrival_s for r in progs[p]) for p in ("p1", "p2", "p3")]
    assert starts[0] == 0.0 and starts[0] < starts[1] < starts[2]
    by_rid = {r.rid: r.arrival_s for r in got}
    # offsets inside a program survive: p1c was 3.0 s after p1a, p2b 0.5 s after p2a
    assert by_rid["p1c"] - by_rid["p1a"] == pytest.approx(3.0)
    assert by_rid["p2b"] - by_rid["p2a"] == pytest.approx(0.5)
    assert [r.arrival_s for r in got] == sorted(r.arrival_s for r in got)


def test_limit_counts_units():
    assert [r.rid for r in limit(FLAT, 2)] == ["r0", "r1"]
    assert sorted(r.rid for r in limit(DAG, 2)) == ["p1a", "p1b", "p1c", "p2a", "p2b"]
    assert limit(DAG, 0) == [] and len(limit(DAG, 99)) == len(DAG)
    with pytest.raises(ValueError):
        limit(DAG, -1)


def test_shaping_a_real_dag_trace_keeps_every_program_complete():
    _need("deepresearch")
    reqs = _bundled("deepresearch").requests
    full = {p: len(v) for p, v in programs(reqs).items()}
    shaped = window(poisson_arrivals(reqs, rate=0.5, seed=1), 100.0, 400.0)
    kept = {p: len(v) for p, v in programs(shaped).items()}
    assert 100 < len(kept) < len(full)  # ~150 programs expected at 0.5/s over 300 s
    assert all(kept[p] == full[p] for p in kept)
