"""Trace to planned requests: windows, unit counts, length shaping, the offered rate, determinism."""

from __future__ import annotations

import pytest

from benchmarks.goodput import workload
from benchmarks.goodput.mixes import Scale
from benchmarks.goodput.workload import WorkloadSpec, at_rate, base_requests, natural_rate, plan
from benchmarks.workloads.traces import TraceLoad, TraceRequest


def _trace() -> list[TraceRequest]:
    lone = [
        TraceRequest(arrival_s=0.5 * i, prompt_tokens=100 * (i + 1), output_tokens=40, rid=f"r{i}") for i in range(20)
    ]
    prog = [
        TraceRequest(arrival_s=3.0, prompt_tokens=300, output_tokens=90, program_id="p", stage=k, rid=f"p{k}",
                     parents=(f"p{k - 1}",) if k else (), prefix_tokens=200 if k else 0)
        for k in range(3)
    ]  # fmt: skip
    return sorted(lone + prog, key=lambda r: r.arrival_s)


@pytest.fixture(autouse=True)
def synthetic_trace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(workload, "load", lambda name, data_dir=None: TraceLoad(_trace()))


def test_lengths_are_scaled_and_capped_and_programs_stay_whole() -> None:
    reqs = base_requests(WorkloadSpec(units=30, length_scale=0.5, max_prompt=400, max_output=30))
    by_rid = {r.rid: r for r in reqs}
    assert by_rid["r0"].prompt_tokens == 50 and by_rid["r0"].output_tokens == 20
    assert by_rid["r19"].prompt_tokens == 400  # 1000 scaled, capped
    assert by_rid["p1"].output_tokens == 30 and by_rid["p1"].prefix_tokens == 100
    assert {"p0", "p1", "p2"} <= set(by_rid)


def test_units_counts_programs_once() -> None:
    reqs = base_requests(WorkloadSpec(units=8))  # r0..r6 arrive before the program at 3.0
    assert len({r.program_id or r.rid for r in reqs}) == 8
    assert sum(r.program_id == "p" for r in reqs) == 3


@pytest.mark.parametrize("arrivals", ["trace", "poisson"])
def test_the_offered_rate_is_the_one_asked_for(arrivals: str) -> None:
    spec = WorkloadSpec(units=21, arrivals=arrivals)
    reqs = base_requests(spec)
    assert natural_rate(reqs) == pytest.approx(20 / 9.5)  # 21 units (one a program) over 9.5 s
    moved = at_rate(reqs, 8.0, spec)
    if arrivals == "trace":  # the trace's shape, four times faster
        assert natural_rate(moved) == pytest.approx(8.0, rel=1e-6)
        gap = 0.5 * (20 / 9.5) / 8.0  # the trace's 0.5 s gaps, compressed to the new rate
        assert sorted(r.arrival_s for r in moved)[:3] == pytest.approx([0.0, gap, 2 * gap])
    else:
        assert natural_rate(moved) == pytest.approx(8.0, rel=0.6)  # 20 exponential gaps
    assert at_rate(reqs, None, spec) == reqs


def test_the_plan_is_the_same_for_every_server_and_changes_with_the_seed() -> None:
    spec = WorkloadSpec(units=21, mix="tempo")
    a = plan(spec, 4.0, Scale(2.0))
    assert a == plan(spec, 4.0, Scale(2.0))
    assert [p.cls for p in a] != [p.cls for p in plan(WorkloadSpec(units=21, mix="tempo", seed=1), 4.0, Scale(2.0))]
    assert {p.req.rid for p in a} == {r.rid for r in base_requests(spec)}


@pytest.mark.parametrize("kwargs", [{"arrivals": "bursty"}, {"units": 0}, {"length_scale": 0.0}, {"max_output": 0}])
def test_bad_specs_say_what_is_wrong(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**kwargs)
