"""Length sources: arXiv summaries are rows of the file that fit OPT's context, drawn without a
repeat until all are used; the synthetic reasoning lengths have SLOs-Serve Tab. 4's statistics;
a workload with a length source keeps its trace's arrivals and takes the source's lengths."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from benchmarks.goodput import workload
from benchmarks.goodput.workload import WorkloadSpec, base_requests
from benchmarks.workloads.lengths import (
    ARXIV_SUMM_FILE,
    REASONING_PROMPT,
    REASONING_RESPONSE,
    REASONING_THINKING,
    arxiv_summ_rows,
    draw_lengths,
    with_lengths,
)
from benchmarks.workloads.traces import TraceLoad, TraceRequest, resolve_data_dir

ROWS = [(1500, 300), (1900, 149), (1900, 148), (100, 20), (3000, 50), (0, 10), (700, 0), (2000, 40)]
FITS = {(1900, 148), (100, 20), (2000, 40), (1500, 300)}  # prompt + output <= 2048, both > 0


def _csv(tmp_path: Path, rows: list[tuple[int, int]]) -> Path:
    path = tmp_path / ARXIV_SUMM_FILE
    path.parent.mkdir(parents=True)
    lines = ["num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"]
    lines += [f"{p},{o},{p + o},{p / max(o, 1)}" for p, o in rows]
    path.write_text("\n".join(lines) + "\n")
    return tmp_path


def _p99(values: list[int]) -> float:
    return statistics.quantiles(values, n=100)[98]


def test_arxiv_keeps_the_rows_that_fit_the_context_and_draws_each_once_per_pass(tmp_path: Path) -> None:
    data = _csv(tmp_path, ROWS)
    assert set(arxiv_summ_rows(data)) == FITS
    draws = draw_lengths("arxiv-summ", 10, seed=3, data_dir=data)
    assert set(draws[:4]) == FITS and set(draws[4:8]) == FITS  # a permutation, then another
    assert draw_lengths("arxiv-summ", 10, seed=3, data_dir=data) == draws
    assert [draw_lengths("arxiv-summ", 4, seed=s, data_dir=data) for s in range(6)] != [draws[:4]] * 6


def test_arxiv_draws_have_the_papers_summarizer_lengths() -> None:
    data = resolve_data_dir()
    if not (data / ARXIV_SUMM_FILE).is_file():
        pytest.skip(f"{ARXIV_SUMM_FILE} not under {data} (set $SGLANG_SLO_DATA)")
    rows = set(arxiv_summ_rows(data))
    draws = draw_lengths("arxiv-summ", 4000, seed=0, data_dir=data)
    assert set(draws) <= rows
    prompts, outputs = [p for p, _ in draws], [o for _, o in draws]
    # Tab. 4 Summarizer: prompt 1333 mean / 444 std, output 202 / 234 (OPT's context kept them < 2048)
    assert statistics.mean(prompts) == pytest.approx(1333, rel=0.03)
    assert statistics.mean(outputs) == pytest.approx(202, rel=0.05)
    assert max(p + o for p, o in draws) <= 2048


@pytest.mark.parametrize(
    ("part", "mean", "std", "p99"),
    [
        (REASONING_PROMPT, 127, 83, 421),
        (REASONING_THINKING, 4693, 1442, 7297),
        (REASONING_RESPONSE, 803, 280, 1650),
    ],
)
def test_synthetic_reasoning_parts_have_the_tables_statistics(part, mean: float, std: float, p99: float) -> None:
    rng = random.Random(0)
    values = [part.draw(rng) for _ in range(40_000)]
    assert statistics.mean(values) == pytest.approx(mean, rel=0.02)
    assert statistics.pstdev(values) == pytest.approx(std, rel=0.05)
    assert _p99(values) == pytest.approx(p99, rel=0.03)
    assert min(values) >= 1


def test_synthetic_reasoning_output_is_thinking_plus_response() -> None:
    draws = draw_lengths("reasoning-synth", 20_000, seed=1)
    assert statistics.mean(p for p, _ in draws) == pytest.approx(127, rel=0.03)
    assert statistics.mean(o for _, o in draws) == pytest.approx(4693 + 803, rel=0.02)
    assert draw_lengths("reasoning-synth", 50, seed=1) == draws[:50]
    assert draw_lengths("reasoning-synth", 50, seed=2) != draws[:50]


def test_a_length_source_keeps_arrivals_and_takes_its_lengths(monkeypatch: pytest.MonkeyPatch) -> None:
    trace = [
        TraceRequest(arrival_s=0.5 * i, prompt_tokens=7, output_tokens=3, prefix_tokens=2, rid=f"r{i}")
        for i in range(30)
    ]
    monkeypatch.setattr(workload, "load", lambda name, data_dir=None: TraceLoad(trace))
    spec = WorkloadSpec(units=30, lengths="reasoning-synth", max_prompt=8192, max_output=6000, seed=4)
    reqs = base_requests(spec)
    drawn = draw_lengths("reasoning-synth", 30, seed=4)
    assert [(r.rid, r.arrival_s) for r in reqs] == [(r.rid, r.arrival_s) for r in trace]
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(p, min(o, 6000)) for p, o in drawn]
    assert all(r.prefix_tokens == 0 for r in reqs)  # the trace's prefix described its own prompts
    assert with_lengths(trace, "reasoning-synth", 4)[0].rid == "r0"


def test_an_unknown_length_source_is_refused() -> None:
    with pytest.raises(ValueError, match="length source"):
        WorkloadSpec(lengths="sharegpt")
    with pytest.raises(ValueError, match="length source"):
        draw_lengths("sharegpt", 3, seed=0)
