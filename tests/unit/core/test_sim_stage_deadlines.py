"""The simulator runs the server's compound stage sub-deadlines when asked: a later program's
stages reach the policy with D_s = φ(s)·D learned from an earlier one, while the records keep
the requests as sent (scored against the program's deadline)."""

from __future__ import annotations

from scheduler.core.compound import CompoundDeadlines
from scheduler.core.perf_model import constant_model
from scheduler.core.policies import make_policy
from scheduler.core.sim import EngineConfig, SimRequest, SimResult, Simulator
from scheduler.core.slo import SloClass, SloSpec

TAU = 0.01  # seconds per step
DEADLINE_S = 50.0


def _stage(program: str, stage: int, arrival: float, output: int, parents: tuple[str, ...] = ()) -> SimRequest:
    slo = SloSpec(deadline_ms=DEADLINE_S * 1000.0, slo_class=SloClass.COMPOUND, program_id=program, stage=stage)
    rid = f"{program}-{stage}"
    return SimRequest(rid, slo, arrival, 8, output, output, output, program_arrival=arrival, parents=parents)


def _workload() -> list[SimRequest]:
    """Program p1 (two stages), then a best-effort request long enough for the engine to close
    p1 as idle (programs are closed every 256 steps), then program p2."""
    return [
        _stage("p1", 0, 0.0, 4),
        _stage("p1", 1, 0.0, 12, parents=("p1-0",)),
        SimRequest("filler", SloSpec(), 0.5, 8, 600, 600, 600),
        _stage("p2", 0, 8.0, 4),
        _stage("p2", 1, 8.0, 12, parents=("p2-0",)),
    ]


def _run(compound: CompoundDeadlines | None) -> SimResult:
    sim = Simulator(
        make_policy("edf"),
        constant_model(TAU),
        EngineConfig(max_running_requests=4, chunk_size=64),
        record_trace=True,
        compound=compound,
    )
    return sim.run(_workload())


def _stage_deadlines_seen(result: SimResult) -> dict[str, float | None]:
    seen: dict[str, float | None] = {}
    for view, _ in result.trace:
        for r in [*view.waiting, *view.running]:
            seen.setdefault(r.rid, r.stage_deadline)
    return seen


def test_a_later_program_gets_sub_deadlines_learned_from_an_earlier_one() -> None:
    compound = CompoundDeadlines(idle_s=1.0)
    result = _run(compound)
    seen = _stage_deadlines_seen(result)
    assert seen["p1-0"] is None and seen["p1-1"] is None  # nothing learned yet
    first, second = seen["p2-0"], seen["p2-1"]
    assert first is not None and second is not None
    assert 8.0 < first < second <= 8.0 + DEADLINE_S + 1e-9  # φ(0)·D, then φ(1)·D = D
    assert compound.matched >= 2
    assert all(rec.req.stage_deadline is None for rec in result.records.values())  # scored as sent
    assert all(rec.finished for rec in result.records.values())


def test_without_the_component_no_stage_has_a_sub_deadline() -> None:
    seen = _stage_deadlines_seen(_run(None))
    assert seen["p2-0"] is None and seen["p2-1"] is None
