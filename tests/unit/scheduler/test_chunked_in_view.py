"""A chunked prefill in progress is in the plan's view: SGLang keeps it out of both the waiting
queue and the running batch until its last chunk, and a pass that could not see it saw no SLO
work at all, so the best-effort tier's hold released every lost request (scheduler/core/
lost_hold.py) into a batch the SLO request still needed."""

from __future__ import annotations

from scheduler.core.perf_model import constant_model
from tests.unit.scheduler._stand_in_engine import StandInReq, slo_scheduler


def _pass_with_chunked(chunked: bool) -> tuple[set[str], int, list[str]]:
    """One pass under SLOs-Serve: a lost request waits (its first token was due at 1 ms), and a
    long SLO request is mid chunked prefill (or, without `chunked`, absent). What SGLang admits,
    how many waiting requests the plan held, and the rids the plan's view had running."""
    s = slo_scheduler(policy="slos", startup_chunk=100, perf=constant_model(0.01))
    s.slo.clock.set(1.0)  # the lost request arrived at 0.0: 999 ms past its first token's due time
    lost = StandInReq("lost", prompt=10, ttft_ms=1.0)
    long = StandInReq("long", prompt=1000, ttft_ms=60_000.0, cached=950)  # its last 50 tokens remain
    s.waiting_queue = [lost]
    if chunked:
        s.chunked_req = long
    seen: list[str] = []
    view_of = s._slo_view
    s._slo_view = lambda batch: (v := view_of(batch), seen.extend(r.rid for r in v.running))[0]  # type: ignore[method-assign]
    out = s.get_new_batch_prefill(s.running_batch)
    admitted = {r.rid for r in out.batch_to_run.reqs} if out.batch_to_run is not None else set()
    return admitted, s.slo.counters.held_waiting, seen


def test_the_chunked_request_is_seen_running_and_keeps_the_lost_one_held() -> None:
    admitted, held, running = _pass_with_chunked(chunked=True)
    assert set(running) == {"long"}  # in every view the pass built
    assert held == 1 and "lost" not in admitted  # the chunk's leftover budget would have fit it


def test_without_slo_work_the_lost_request_starts() -> None:
    admitted, held, running = _pass_with_chunked(chunked=False)
    assert running == [] and held == 0 and admitted == {"lost"}
