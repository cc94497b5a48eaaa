"""What a pass's applied plan leaves for the next pass (AppliedPlan's docstring): a pass without
a plan keeps the last plan's batch cap and prefill budget, as SGLang keeps the settings the plan
made, while a plan's deferred prefill and held requests never outlive their own pass."""

from __future__ import annotations

from scheduler.core.perf_model import constant_model
from tests.unit.scheduler._rank_scenario import rank_scheduler
from tests.unit.scheduler._stand_in_engine import StandInReq, slo_scheduler


def test_levers_carry_over_a_pass_without_a_plan_and_the_deferral_does_not() -> None:
    s = rank_scheduler(leader=True)
    s.get_new_batch_prefill(s.running_batch)
    first = s.slo.pass_state.applied
    assert first.batch_cap is not None and first.prefill_tokens is not None and not first.prefill_open
    chunk = s.chunked_prefill_size
    s.waiting_queue = []  # nothing waits: the next pass makes no plan
    out = s.get_new_batch_prefill(s.running_batch)
    after = s.slo.pass_state.applied
    assert s.slo.pass_state.step == 2 and s.slo.counters.planned_passes == 1
    assert (after.batch_cap, after.prefill_tokens) == (first.batch_cap, first.prefill_tokens)
    assert after.prefill_open and out.batch_to_run is None and s.chunked_prefill_size == chunk
    assert s.slo.counters.prefill_deferred == 1  # the first pass only


def test_a_hold_ends_with_its_pass_and_the_count_stays_the_last_plans() -> None:
    s = slo_scheduler(policy="slos", startup_chunk=100, perf=constant_model(0.01))
    s.slo.clock.set(1.0)  # the lost request's first token was due at 1 ms
    s.waiting_queue = [StandInReq("lost", prompt=10, ttft_ms=1.0)]
    s.chunked_req = StandInReq("long", prompt=1000, ttft_ms=60_000.0, cached=950)  # SLO work running
    s.get_new_batch_prefill(s.running_batch)
    assert s.slo.pass_state.applied.hold == {"lost"} and [r.rid for r in s.waiting_queue] == ["lost"]
    s.waiting_queue, s.chunked_req = [], None
    s.get_new_batch_prefill(s.running_batch)
    assert s.slo.pass_state.applied.hold == frozenset() and s.slo.pass_state.applied.hold_at is None
    assert (s.slo.counters.held_waiting, s.slo.counters.lost_held_passes) == (1, 1)
