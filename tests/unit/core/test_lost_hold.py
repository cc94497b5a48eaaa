"""The best-effort tier's hold: which past-due requests wait for a lull, on the plan path and in
the simulator, and that holding them never loses one."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.lost_hold import held_lost_causes, past_due
from scheduler.core.perf_model import constant_model
from scheduler.core.plan_path import DECODE, PlanSettings, finalize_plan, settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim import EngineConfig, SimRecord, SimRequest, Simulator
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import RequestView, StepPlan
from tests.unit.core.policy_cases import policy_view, stage_behind_its_sub_deadline

TTFT = SloSpec(ttft_ms=100.0, tpot_ms=50.0, slo_class=SloClass.LATENCY)
DEADLINE = SloSpec(deadline_ms=1000.0, slo_class=SloClass.DEADLINE)
NOW = 5.0


def _req(rid: str, slo: SloSpec = TTFT, arrival: float = NOW, **kw: object) -> RequestView:
    return RequestView(rid=rid, slo=slo, arrival=arrival, prompt_len=100, max_new_tokens=10, **kw)  # type: ignore[arg-type]


def test_past_due_is_a_missed_next_token_or_deadline():
    assert past_due(_req("a", arrival=NOW - 0.2), NOW)  # first token was due at NOW - 0.1
    assert not past_due(_req("b", arrival=NOW - 0.05), NOW)  # still 50 ms to go
    assert past_due(_req("c", DEADLINE, arrival=NOW - 2.0), NOW)
    assert not past_due(_req("d", DEADLINE, arrival=NOW - 0.5), NOW)
    # Started (a retracted request waits with its tokens): lost once its next token is late.
    assert past_due(_req("e", arrival=NOW - 0.2, first_token_time=NOW - 0.15, generated=1), NOW)
    assert not past_due(_req("g", arrival=NOW - 0.2, first_token_time=NOW - 0.15, generated=4), NOW)
    assert not past_due(_req("f", SloSpec(), arrival=0.0), NOW)  # best effort: never due


def test_a_compound_stage_is_past_due_only_when_its_program_deadline_is():
    assert not past_due(stage_behind_its_sub_deadline(arrival=0.0), NOW)  # sub-deadline 4.95 s ago
    assert past_due(stage_behind_its_sub_deadline(arrival=NOW - 61.0), NOW)


def test_only_past_due_requests_in_the_tier_are_held_and_only_while_slo_work_runs():
    lost, declined, outside = _req("lost", arrival=0.0), _req("declined"), _req("outside", arrival=0.0)
    stream = _req("stream", arrival=0.0, first_token_time=0.05, generated=20)
    view = policy_view([lost, declined, outside], [stream], now=NOW)
    # `outside` is past due too but not in the tier: admission still owns it.
    assert held_lost_causes(view, {"lost", "declined"}) == {"lost"}
    # Nothing with an SLO left to keep: the tier runs now.
    stream.best_effort_tier = True
    assert held_lost_causes(policy_view([lost], [stream], now=NOW), {"lost"}) == frozenset()
    # ... unless SLO work is still waiting outside the tier.
    assert held_lost_causes(policy_view([lost, declined], [stream], now=NOW), {"lost"}) == {"lost"}
    assert held_lost_causes(policy_view([lost], [_req("be", SloSpec())], now=NOW), {"lost"}) == frozenset()


def test_the_plan_path_holds_for_slo_policies_only_and_never_on_a_decode_worker():
    lost = _req("lost", arrival=0.0)
    view = policy_view([lost], [_req("stream", arrival=0.0, first_token_time=0.05, generated=20)], now=NOW)
    plan = StepPlan(order=["lost"], best_effort={"lost"})
    assert finalize_plan(view, plan, PlanSettings()).hold == {"lost"}
    baseline = settings_for(make_policy("edf"))  # the papers' EDF on a stock engine
    assert finalize_plan(view, plan, baseline).hold == frozenset()
    assert finalize_plan(view, plan, PlanSettings(role=DECODE)).hold == frozenset()


class _DeclineLost:
    """Puts every past-due waiting request in the tier, as slos and tempo do."""

    name = "decline-lost"
    slo_levers = True

    def plan(self, view):  # type: ignore[no-untyped-def]
        lost = {r.rid for r in view.waiting if past_due(r, view.now)}
        return StepPlan(order=[r.rid for r in view.waiting], best_effort=lost)


@pytest.mark.parametrize("levers", [True, False])
def test_a_held_request_starts_when_the_slo_work_is_done_and_is_served_whole(levers):
    tau = 0.01
    policy = _DeclineLost()
    policy.slo_levers = levers
    stream = SimRequest("stream", TTFT, 0.0, prompt_len=50, output_len=40)
    lost = SimRequest("lost", SloSpec(ttft_ms=1.0, slo_class=SloClass.LATENCY), 0.045, prompt_len=50, output_len=5)
    sim = Simulator(policy, constant_model(tau), EngineConfig(max_running_requests=8, chunk_size=512))  # type: ignore[arg-type]
    records = sim.run([stream, lost]).records
    assert len(records["lost"].token_times) == 5 and records["lost"].drop_reason is None  # nothing lost
    stream_end = records["stream"].token_times[-1]
    if levers:  # held: no slot beside the stream
        assert records["lost"].token_times[0] > stream_end
    else:  # the tier alone: a free slot starts it at once
        assert records["lost"].token_times[0] < stream_end - 10 * tau


@pytest.mark.parametrize("fresh", [0, 1, 3, 12, 40])
def test_a_tier_given_as_positions_holds_what_the_same_tier_given_as_rids_holds(fresh: int):
    # 20 past due and `fresh` that may still make it, all in the tier, shuffled in the queue:
    # the hold is the whole tier, most of it, or a small part of it.
    waiting = [_req(f"lost{i}", arrival=0.0) for i in range(20)] + [_req(f"fresh{i}") for i in range(fresh)]
    waiting += [_req(f"out{i}") for i in range(5)]  # outside the tier: SLO work still to keep
    random.Random(fresh).shuffle(waiting)
    view = policy_view(waiting, [_req("stream", arrival=0.0, first_token_time=0.05, generated=20)], now=NOW)
    tier = {r.rid for r in waiting if not r.rid.startswith("out")}
    order = [r.rid for r in waiting]
    at = np.array([i for i, r in enumerate(waiting) if r.rid in tier], dtype=np.int64)
    by_rids = finalize_plan(view, StepPlan(order=order, best_effort=set(tier)), PlanSettings())
    by_positions = finalize_plan(
        view,
        StepPlan(order=order, best_effort=frozenset(tier), order_at=np.arange(len(order)), best_effort_at=at),
        PlanSettings(),
    )
    assert by_positions.hold_at is not None and len(by_positions.hold_at) == 20
    assert by_positions.hold == by_rids.hold == {f"lost{i}" for i in range(20)}


def _lost_stream(rid: str, slo: SloSpec = TTFT) -> RequestView:
    """A running request of the tier whose next token was due long ago: its SLO is lost."""
    return _req(rid, slo, arrival=0.0, first_token_time=1.0, generated=20, best_effort_tier=True)


def test_a_lost_request_of_the_tier_yields_its_slot_to_slo_work_the_cap_leaves_no_room():
    on_time = _req("on-time", arrival=NOW - 0.05, first_token_time=NOW - 0.01, generated=1)
    late_few, late_many = _lost_stream("late-few"), _lost_stream("late-many")
    late_many.generated = 80
    batch_job = _req("batch-job", SloSpec(), arrival=0.0, first_token_time=1.0, generated=5)
    running = [on_time, late_many, batch_job, late_few]
    waiting = [_req("new-a"), _req("new-b"), _req("lost-waiting", arrival=0.0)]
    view = policy_view(waiting, running, cap=8, now=NOW)
    plan = StepPlan(order=["new-a", "new-b", "lost-waiting"], best_effort={"lost-waiting"}, batch_cap=4)
    # Two requests with an SLO wait outside the tier, the cap is full: the two lost ones go, the
    # one with the fewest tokens out first; never a request still on time or a best-effort job.
    assert finalize_plan(view, plan, PlanSettings()).preempt == ("late-few", "late-many")
    plan.batch_cap = 5  # room for one of them: one lost request yields
    assert finalize_plan(view, plan, PlanSettings()).preempt == ("late-few",)
    plan.batch_cap = 6
    assert finalize_plan(view, plan, PlanSettings()).preempt == ()
    plan.batch_cap = 4
    # A lost one still prefilling has nothing to retract yet (SGLang retracts decoding requests).
    prefilling = _req("prefilling", arrival=0.0, best_effort_tier=True)
    view_prefilling = policy_view(waiting, [on_time, batch_job, prefilling, late_few], cap=8, now=NOW)
    assert finalize_plan(view_prefilling, plan, PlanSettings()).preempt == ("late-few",)
    # Only the tier's SLO requests count as work to make room for.
    tier_only = StepPlan(order=["lost-waiting"], best_effort={"lost-waiting"}, batch_cap=4)
    tier_view = policy_view(waiting[2:], running, cap=8, now=NOW)
    assert finalize_plan(tier_view, tier_only, PlanSettings()).preempt == ()
    # A batch over the cap the SLO work sets sheds its lost requests though nobody waits.
    tier_only.batch_cap = 3
    assert finalize_plan(tier_view, tier_only, PlanSettings()).preempt == ("late-few",)
    # An ordering baseline reorders a stock engine, and a decode worker's requests hold their KV.
    assert finalize_plan(view, plan, settings_for(make_policy("edf"))).preempt == ()
    assert finalize_plan(view, plan, PlanSettings(role=DECODE)).preempt == ()
    # Given as positions, the tier yields the same.
    at = StepPlan(
        order=plan.order,
        best_effort=frozenset(plan.best_effort),
        batch_cap=4,
        order_at=np.arange(3),
        best_effort_at=np.array([2]),
    )
    assert finalize_plan(view, at, PlanSettings()).preempt == ("late-few", "late-many")


def _two_lost_fill_both_slots_then(fresh: list[SimRequest], levers: bool) -> dict[str, SimRecord]:
    """Two requests lost while two others hold both slots go to the tier; once those two are
    done the lost ones fill the slots (nothing else to serve); then `fresh` arrive. Checks that
    both lost requests are answered in full, whatever the retractions, and returns the records."""
    policy = _DeclineLost()
    policy.slo_levers = levers
    first = [SimRequest(f"first{i}", TTFT, 0.0, prompt_len=50, output_len=20) for i in range(2)]
    lost = [
        SimRequest(f"lost{i}", SloSpec(ttft_ms=1.0, tpot_ms=5.0, slo_class=SloClass.LATENCY), 0.01, 50, 200)
        for i in range(2)
    ]
    sim = Simulator(policy, constant_model(0.01), EngineConfig(max_running_requests=2, chunk_size=512))  # type: ignore[arg-type]
    records = sim.run([*first, *lost, *fresh]).records
    for i in range(2):  # nothing lost
        assert len(records[f"lost{i}"].token_times) == 200 and records[f"lost{i}"].drop_reason is None
    return records


@pytest.mark.parametrize("levers", [True, False])
def test_a_newcomer_takes_the_slot_of_a_lost_request_which_still_finishes_whole(levers):
    fresh = SimRequest("fresh", TTFT, 0.5, prompt_len=50, output_len=10)  # an SLO it can keep
    records = _two_lost_fill_both_slots_then([fresh], levers)
    assert all(records[f"lost{i}"].token_times[0] < fresh.arrival for i in range(2))  # both running
    ttft = records["fresh"].token_times[0] - fresh.arrival
    if levers:  # a lost request steps aside: the newcomer starts within its 100 ms
        assert ttft < 0.1
        assert sum(records[f"lost{i}"].preemptions for i in range(2)) == 1
    else:  # a stock engine's order alone: it waits for a slot, past its first token's due time
        assert ttft > 1.0


@pytest.mark.parametrize("levers", [True, False])
def test_a_lost_request_that_yielded_waits_out_the_slo_work_instead_of_churning(levers):
    # Requests with an SLO arrive one every 50 ms for a second, each answered in 100 ms: SLO
    # work is in the engine throughout, while a slot is often free between them.
    fresh = [SimRequest(f"fresh{i}", TTFT, 0.5 + 0.05 * i, prompt_len=50, output_len=10) for i in range(20)]
    records = _two_lost_fill_both_slots_then(fresh, levers)
    yields = [records[f"lost{i}"].preemptions for i in range(2)]
    worst_ttft = max(records[r.rid].token_times[0] - r.arrival for r in fresh)
    if levers:  # a lost request yields once and waits out the SLO work: every newcomer starts in time
        assert max(yields) == 1
        assert worst_ttft < 0.1
    else:  # a stock engine's order: the lost requests keep both slots and the newcomers queue
        assert sum(yields) == 0
        assert worst_ttft > 1.0
