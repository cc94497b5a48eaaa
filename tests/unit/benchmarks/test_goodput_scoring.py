"""benchmarks.goodput.scoring against hand-computed runs: per-token TPOT misses, deadline edges,
compound programs judged from their first send, never-sent stages, percentiles, the timeline,
no-SLO requests kept out of attainment, and the consistency invariants."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks.goodput.records import RequestRecord
from benchmarks.goodput.scoring import RunMetrics, check_consistency, percentiles_ms, score, score_record, timeline

LAT_SLO = {"class": "latency", "ttft_ms": 100, "tpot_ms": 50}  # token i due 0.1 + 0.05 i after send


def rec(
    key: str, cls: str, slo: dict, send: float | None, tokens: list[float], finish: float | None, **kw
) -> RequestRecord:
    reason = kw.pop("finish_reason", "length" if finish is not None else None)
    return RequestRecord(
        key=key,
        cls=cls,
        slo=slo,
        prompt_tokens=kw.pop("prompt_tokens", 10),
        target_output_tokens=kw.pop("target_output_tokens", len(tokens)),
        scheduled_s=send if send is not None else kw.pop("scheduled_s", 0.0),
        send_s=send,
        token_s=tokens,
        finish_s=finish,
        finish_reason=reason,
        **kw,
    )


def consistent(m: RunMetrics) -> RunMetrics:
    assert check_consistency(m) == []
    assert json.loads(json.dumps(m.to_dict(), allow_nan=False)) == m.to_dict()
    return m


def compound(key: str, stage: int, send: float | None, finish: float | None, **kw) -> RequestRecord:
    slo = {"class": "compound", "program_id": "p1", "stage": stage, "deadline_ms": 1000}
    tokens = [] if send is None else [send + 0.1, finish]
    return rec(key, "compound", slo, send, tokens, finish, program_id="p1", program_start_s=0.0,
               program_deadline_s=1.0, target_output_tokens=2, **kw)  # fmt: skip


def test_latency_request_with_a_late_third_token_misses_tpot():
    # due 1.10, 1.15, 1.20; the third token comes at 1.30
    late = rec("r0", "latency", LAT_SLO, 1.0, [1.05, 1.10, 1.30], 1.30)
    s = score_record(late)
    assert s.outcome.ttft_ok is True and s.outcome.tpot_ok is False and not s.outcome.attained
    m = consistent(score([late]))
    assert m.attained == 0 and m.attainment == 0.0 and m.goodput_rps == 0.0
    assert m.dslo_tokens == 2 and m.output_tokens == 3
    assert m.finished == 1 and m.finished_rps == pytest.approx(1 / 0.3)
    assert 0 < m.service_gain < m.service_gain_potential  # the late token is worth less than full
    assert m.tpot_ms["p50"] == pytest.approx(125.0)  # (1.30 - 1.05) / 2


def test_deadline_request_finishing_exactly_at_its_deadline_is_attained():
    r = rec("r0", "deadline", {"class": "deadline", "deadline_ms": 500}, 2.0, [2.1, 2.5], 2.5)
    m = consistent(score([r]))
    assert m.attained == 1 and m.attainment == 1.0
    assert m.goodput_rps == pytest.approx(2.0)  # 1 request over the 0.5 s makespan
    assert m.dslo_tokens == 2
    assert m.service_gain_ratio == pytest.approx(1.0)
    just_late = dataclasses.replace(r, finish_s=2.5001, token_s=[2.1, 2.5001])
    assert score([just_late]).attained == 0


def test_compound_stage_finishing_after_the_program_deadline_misses():
    # program starts at 0 with a 1 s deadline; stage 1 is sent at 0.5 and finishes at 1.2: late for the
    # program although within 1 s of its own send
    first, second = compound("p1.s0.0", 0, 0.0, 0.4), compound("p1.s1.0", 1, 0.5, 1.2)
    assert score_record(first).outcome.attained
    assert not score_record(second).outcome.attained
    m = consistent(score([first, second]))
    assert m.attained == 1 and m.attainment == 0.5
    assert m.attainment_by_class == {"compound": 0.5}
    assert m.jitserve_tokens == 0  # the program missed: none of its calls count
    on_time = consistent(score([first, compound("p1.s1.0", 1, 0.5, 0.9)]))
    assert on_time.jitserve_tokens == 2 * (10 + 2)


def test_never_sent_stages_count_as_unfinished_misses():
    never = compound("p1.s2.0", 2, None, None, scheduled_s=0.9)
    assert not score_record(never).outcome.attained
    m = consistent(score([compound("p1.s0.0", 0, 0.0, 0.4), never]))
    assert m.requests == 2 and m.sent == 1 and m.never_sent == 1 and m.finished == 1
    assert m.lost == 0 and m.cut == 0
    assert m.attainment == 0.5
    assert m.service_gain_potential > m.service_gain  # the unsent stage's tokens are still owed


def test_cut_lost_and_dropped_partition_the_requests():
    ok = rec("r0", "latency", LAT_SLO, 0.0, [0.05], 0.05)
    cut = rec("r1", "latency", LAT_SLO, 0.0, [0.05], None, cut=True)
    lost = rec("r2", "latency", LAT_SLO, 0.0, [], None)
    dropped = rec("r3", "latency", LAT_SLO, 0.0, [], 0.2, finish_reason="abort")
    m = consistent(score([ok, cut, lost, dropped]))
    assert (m.finished, m.cut, m.lost, m.dropped, m.never_sent) == (1, 1, 1, 1, 0)
    assert m.attainment == 0.25


def test_percentiles_on_a_known_set():
    assert percentiles_ms([i / 1000 for i in range(0, 101, 10)]) == pytest.approx({"p50": 50, "p90": 90, "p99": 99})
    assert percentiles_ms([]) == {"p50": None, "p90": None, "p99": None}
    records = [rec(f"r{i}", "deadline", {"deadline_ms": 1000}, 0.0, [i / 100], i / 100 + 0.5) for i in range(11)]
    m = consistent(score(records))
    assert m.ttft_ms == pytest.approx({"p50": 50, "p90": 90, "p99": 99})
    assert m.e2e_ms == pytest.approx({"p50": 550, "p90": 590, "p99": 599})


def test_host_transit_is_the_clients_ttft_minus_the_servers_own():
    seen = [rec(f"r{i}", "latency", LAT_SLO, 1.0, [1.2 + i / 1000], 1.3, server_ttft_ms=150.0) for i in range(11)]
    stock = rec("s", "latency", LAT_SLO, 1.0, [1.5], 1.6)  # no report of its own: not counted
    m = consistent(score([*seen, stock]))
    assert m.host_transit_ms == pytest.approx({"p50": 55, "p90": 59, "p99": 59.9})
    assert consistent(score([stock])).host_transit_ms == {"p50": None, "p90": None, "p99": None}


def test_no_slo_requests_count_in_throughput_but_not_attainment():
    met = rec("r0", "deadline", {"deadline_ms": 1000}, 0.0, [0.5, 1.0], 1.0)
    missed = rec("r1", "deadline", {"deadline_ms": 100}, 0.0, [0.5], 1.0)
    plain = rec("r2", "none", {}, 0.0, [0.2, 0.4, 0.6], 0.8)
    m = consistent(score([met, missed, plain]))
    assert m.requests == 3 and m.slo_requests == 2 and m.finished == 3
    assert m.attainment == 0.5 and m.attained == 1
    assert m.attainment_by_class == {"deadline": 0.5}
    assert m.requests_by_class == {"deadline": 2, "none": 1}
    assert m.output_tokens == 6 and m.throughput_tok_s == pytest.approx(6.0)
    assert m.finished_rps == pytest.approx(3.0) and m.goodput_rps == pytest.approx(1.0)


def test_attainment_per_tier_and_explicit_duration():
    a = rec("r0", "deadline", {"deadline_ms": 1000}, 0.0, [0.5], 0.5, tier="admitted")
    b = rec("r1", "deadline", {"deadline_ms": 100}, 0.0, [0.5], 0.5, tier="best_effort")
    m = consistent(score([a, b], duration_s=10.0))
    assert m.attainment_by_tier == {"admitted": 1.0, "best_effort": 0.0}
    assert m.requests_by_tier == {"admitted": 1, "best_effort": 1}
    assert m.duration_s == 10.0 and m.goodput_rps == pytest.approx(0.1)


def test_empty_run_is_json_safe():
    m = consistent(score([]))
    assert m.requests == 0 and m.duration_s is None and m.goodput_rps is None
    assert m.service_gain_ratio is None and timeline([], 1.0) == []


def test_timeline_bins_on_a_hand_example():
    records = [
        rec("r0", "deadline", {"deadline_ms": 2000}, 0.2, [0.5, 0.9], 0.9),  # attained, ends in bin 0
        rec("r1", "deadline", {"deadline_ms": 500}, 0.5, [1.2, 1.5, 1.7], 1.7),  # late: finished, not attained
        rec("r2", "none", {}, 1.1, [2.4], 2.5),  # no SLO: throughput only
        rec("r3", "deadline", {"deadline_ms": 5000}, 1.5, [2.1], None, cut=True),  # still in flight at the end
    ]
    rows = timeline(records, bin_s=1.0)
    assert [r["t_s"] for r in rows] == [0.0, 1.0, 2.0]
    assert [r["goodput_rps"] for r in rows] == [1.0, 0.0, 0.0]
    assert [r["finished_rps"] for r in rows] == [1.0, 1.0, 1.0]
    assert [r["throughput_tok_s"] for r in rows] == [2.0, 3.0, 2.0]
    assert [r["queue"] for r in rows] == [1, 2, 1]  # at 1 s: r1; at 2 s: r2, r3; at 3 s: r3
    half = timeline(records, bin_s=0.5)
    assert len(half) == 6 and half[1]["goodput_rps"] == 2.0  # r0 finishes at 0.9, in [0.5, 1.0)
    with pytest.raises(ValueError):
        timeline(records, 0.0)


def test_check_consistency_names_each_broken_invariant():
    m = score([rec("r0", "deadline", {"deadline_ms": 1000}, 0.0, [0.5], 0.5)])
    assert check_consistency(m) == []
    bad = dataclasses.replace(m, attainment=1.5, cut=1, dslo_tokens=5, goodput_rps=99.0)
    problems = " / ".join(check_consistency(bad))
    for word in ("attainment", "never_sent", "DSLO", "goodput"):
        assert word in problems
