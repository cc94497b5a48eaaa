"""The view builder keeps one view per request and refreshes only what SGLang changed."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from scheduler.components.plan_applier import order_waiting
from scheduler.components.request_state import RequestStates
from scheduler.components.views import EngineLimits, ViewBuilder
from scheduler.core.clock import ManualClock
from scheduler.core.columns import ViewColumns
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.perf_model import default_model
from scheduler.core.plan_path import FinalPlan, LeverModel, finalize_plan, plan_pass, settings_for
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.slo import REJECT_WHEN_INFEASIBLE, SloClass, SloSpec
from scheduler.core.types import EngineView, StepPlan
from tests.unit.scheduler._stand_in_engine import StandInReq
from wire import TOKEN_TS_KEY

LIMITS = EngineLimits(max_running_requests=8, chunk_size=512, free_kv_tokens=1000, total_kv_tokens=2000, step=3)


def _builder() -> tuple[ViewBuilder, RequestStates]:
    states = RequestStates()
    return ViewBuilder(states, ManualClock(5.0), CompoundDeadlines()), states


def test_an_unchanged_request_keeps_its_view_and_a_changed_one_is_refreshed() -> None:
    views, _ = _builder()
    req = StandInReq("a", 100, ttft_ms=500, tpot_ms=50, cached=10)
    first = views.engine_view([req], [], LIMITS).waiting[0]
    assert views.engine_view([req], [], LIMITS).waiting[0] is first and first.prefix_cached == 10
    req.prefix_len = 60  # SGLang re-matched its prefix
    assert views.engine_view([req], [], LIMITS).waiting[0].prefix_cached == 60
    assert views.cached_tokens_read == 10 + 60  # each read of the request counted its cached prefix
    req.output_ids = [1, 2, 3]
    req.customized_info = {TOKEN_TS_KEY: [5.5, 5.6, 5.7]}
    view = views.engine_view([], [req], LIMITS).running[0]
    assert (view.generated, view.attained_service, view.first_token_time) == (3, 103.0, 5.5)


def test_the_tier_follows_the_latest_plan_and_forgotten_requests_are_rebuilt() -> None:
    views, states = _builder()
    req = StandInReq("a", 100, ttft_ms=500, tpot_ms=50)
    assert not views.engine_view([req], [], LIMITS).waiting[0].best_effort_tier
    states.mark_tier(["a"], frozenset({"a"}))  # the last plan put it in the best-effort tier
    assert views.engine_view([req], [], LIMITS).waiting[0].best_effort_tier
    states.mark_tier(["a"], frozenset())
    old = views.engine_view([req], [], LIMITS).waiting[0]
    assert not old.best_effort_tier
    views.forget("a")
    assert views.engine_view([req], [], LIMITS).waiting[0] is not old


COLUMNS = (
    "arrival prompt max_new base deadline ttft_s tpot_s weight max_queue_s "
    "generated cached started predicted be_tier attained cls rejects"
).split()


def _assert_known_rows_are_the_views(view: EngineView) -> None:
    """The rows the builder handed over hold what the views say now, as a fresh read does."""
    assert view.known_rows is not None
    known = ViewColumns.read(view.waiting, view.running, known=view.known_rows)
    fresh = ViewColumns.read(view.waiting, view.running)
    assert known._dynamic is not None  # the known rows were used, no view was read
    assert known.rids == fresh.rids
    for name in COLUMNS:
        np.testing.assert_array_equal(getattr(known, name), getattr(fresh, name), err_msg=name)


def test_the_rows_handed_to_the_plan_stay_right_as_requests_arrive_change_and_leave() -> None:
    views, states = _builder()
    views.row_slack = 0  # rebuild the rows as soon as departed requests outnumber live ones
    reqs = [StandInReq(f"r{i}", 50 + i, ttft_ms=500, tpot_ms=50, cached=i % 3) for i in range(12)]
    waiting, running = list(reqs[:8]), []
    for step in range(12):
        if step % 3 == 0 and waiting:  # SGLang admits the head: it starts decoding
            req = waiting.pop(0)
            req.customized_info = {TOKEN_TS_KEY: [5.0 + step]}
            running.append(req)
        for req in running:  # a decode step
            req.output_ids.append(1)
            req.customized_info[TOKEN_TS_KEY].append(5.1 + step)  # type: ignore[index]
        if step == 4:  # SGLang re-matched a waiting prefix
            waiting[-1].prefix_len = 33
        if step in (5, 9):  # the plan moved requests into (and out of) the best-effort tier
            states.mark_tier(
                [r.rid for r in waiting], frozenset(r.rid for r in waiting[::2]) if step == 5 else frozenset()
            )
        if step == 6:  # a retraction: a running request queues again with its output so far
            waiting.append(running.pop(0))
        if step == 7:  # one finishes and leaves; a new one arrives
            views.forget(running.pop().rid)
            waiting.append(reqs[8 + step % 4])
        view = views.engine_view(waiting, running, LIMITS)
        _assert_known_rows_are_the_views(view)
    assert len(views.rows) <= 2 * (len(waiting) + len(running)) + 2  # departed rows were dropped


def test_a_view_built_from_other_lists_reads_its_own_views() -> None:
    views, _ = _builder()
    view = views.engine_view([StandInReq("a", 10), StandInReq("b", 20)], [], LIMITS)
    other = replace(view, waiting=view.waiting[::-1])  # e.g. an oracle variant's copy
    assert ViewColumns.read(other.waiting, other.running, known=other.known_rows).rids == ["b", "a"]


def _mixed_requests(n: int) -> list[StandInReq]:
    """Every kind of SLO the plan path treats apart: tight and loose latency, deadlines that
    reject when infeasible, queue timeouts, best effort."""
    specs = [
        SloSpec(ttft_ms=300, tpot_ms=40, slo_class=SloClass.LATENCY),
        SloSpec(ttft_ms=2000, tpot_ms=200, slo_class=SloClass.LATENCY, max_queue_ms=1500),
        SloSpec(deadline_ms=4000, slo_class=SloClass.DEADLINE, on_infeasible=REJECT_WHEN_INFEASIBLE),
        SloSpec(deadline_ms=60_000, slo_class=SloClass.DEADLINE),
        SloSpec(),
    ]
    return [
        StandInReq(f"r{i}", 40 + 37 * i % 500, spec=specs[i % len(specs)], arrival=0.3 * i, cached=(i % 4) * 8)
        for i in range(n)
    ]


@pytest.mark.parametrize("name", list(POLICIES))
def test_plans_from_the_known_rows_are_the_plans_from_the_views(name: str) -> None:
    """The plan path reads the rows the builder kept (and finishes every policy's plan on
    them): pass after pass, each plan is what the views alone give."""
    perf = default_model()
    kept, alone = make_policy(name, perf), make_policy(name, perf)
    settings = settings_for(kept)
    clock = ManualClock(5.0)
    states = RequestStates()
    views = ViewBuilder(states, clock, CompoundDeadlines())
    reqs = _mixed_requests(30)
    waiting, running = list(reqs[:24]), []
    positioned = 0  # passes whose plan came with positions
    for step in range(10):
        clock.advance(0.4)
        if waiting and step % 2 == 0:
            req = waiting.pop(0)
            req.customized_info = {TOKEN_TS_KEY: [clock.now()]}
            running.append(req)
        for req in running:
            req.output_ids.append(1)
            req.customized_info[TOKEN_TS_KEY].append(clock.now())  # type: ignore[index]
        if waiting and step % 3 == 1:  # the admission walk stopped at the head: re-matched its prefix
            waiting[0].prefix_len = step + 1
        if step == 5:
            waiting.extend(reqs[24:])
        limits = replace(LIMITS, step=step, max_running_requests=4)
        view = views.engine_view(waiting, running, limits)
        _assert_known_rows_are_the_views(view)
        planned = plan_pass(view, kept, settings, LeverModel(perf))
        bare = replace(view, known_rows=None)
        assert planned == finalize_plan(bare, alone.plan(bare), settings, LeverModel(perf))
        if planned.order_at is not None:  # the positions name the plan's own rids
            positioned += 1
            assert planned.order is not None
            assert [view.waiting[i].rid for i in planned.order_at.tolist()] == list(planned.order)
        if planned.best_effort_at is not None:
            assert {view.waiting[i].rid for i in planned.best_effort_at.tolist()} == planned.best_effort
        if planned.hold_at is not None:
            assert {view.waiting[i].rid for i in planned.hold_at.tolist()} == planned.hold
        _apply_as_the_adapter_does(views, waiting, planned, states)
    assert positioned or name not in ("tempo", "gmax", "slos")  # they rank positions


def _apply_as_the_adapter_does(views: ViewBuilder, waiting: list, plan: FinalPlan, states: RequestStates) -> None:
    """The adapter's _slo_apply: drops leave the queue, the order and tier are applied, and the
    view builder learns how the queue moved."""
    if plan.drop:
        waiting[:] = [r for r in waiting if r.rid not in plan.drop]
        views.queue.forget()
    views.queue.applied(waiting, order_waiting(waiting, plan, states, views.waiting_rids(waiting)))


class _Watched(StandInReq):
    """A request that notes when the view builder looks at it."""

    def __init__(self, rid: str, looked: set[str], **kwargs: Any) -> None:
        self.looked = looked
        super().__init__(rid, **kwargs)

    @property
    def prefix_len(self) -> int:
        self.looked.add(self.rid)
        return self._prefix

    @prefix_len.setter
    def prefix_len(self, value: int) -> None:
        self._prefix = value


def test_after_an_applied_order_only_what_sglang_may_have_touched_is_looked_at() -> None:
    views, states = _builder()
    looked: set[str] = set()
    reqs = [_Watched(f"r{i}", looked, prompt=40 + i, ttft_ms=500, tpot_ms=50, cached=i) for i in range(14)]
    waiting, running = list(reqs[:10]), []
    view = views.engine_view(waiting, running, LIMITS)
    _apply_as_the_adapter_does(views, waiting, FinalPlan(order=tuple(v.rid for v in view.waiting[::-1])), states)
    assert [r.rid for r in waiting] == [f"r{i}" for i in range(9, -1, -1)]
    # SGLang's walk admits the head, stops at the next request (re-matching its prefix); two arrive
    running += waiting[:2]
    del waiting[:2]
    for req in running:
        req.output_ids.append(1)
        req.customized_info = {TOKEN_TS_KEY: [5.5]}
    waiting[0].prefix_len = 30
    waiting += reqs[10:12]
    looked.clear()
    view = views.engine_view(waiting, running, LIMITS)
    assert looked == {"r7", "r10", "r11", "r9", "r8"}  # the stopped head, the arrivals, the running
    assert view.waiting[0].prefix_cached == 30
    _assert_known_rows_are_the_views(view)
    _apply_as_the_adapter_does(views, waiting, FinalPlan(), states)  # nothing reordered
    del waiting[4]  # an abort from inside the queue, and an arrival: the next pass looks at everyone
    waiting.append(reqs[12])
    waiting[5].prefix_len = 3
    looked.clear()
    view = views.engine_view(waiting, running, LIMITS)
    assert looked >= {r.rid for r in waiting}
    _assert_known_rows_are_the_views(view)
    looked.clear()
    views.engine_view(waiting, running, LIMITS)  # no order applied since: everyone again
    assert looked >= {r.rid for r in waiting}


@pytest.mark.parametrize(("hold", "by_position"), [({"r1", "r4"}, False), ({"r1", "r4"}, True), ({"r6", "r7"}, True)])
def test_requests_held_out_of_the_admission_walk_are_followed_to_the_tail(hold: set[str], by_position: bool) -> None:
    """Held from inside the queue or from its tail (where order_waiting puts a plan's held
    positions: nothing then moves), found by rid or by position."""
    views, states = _builder()
    looked: set[str] = set()
    reqs = [_Watched(f"r{i}", looked, prompt=40 + i, ttft_ms=500, tpot_ms=50, cached=i) for i in range(10)]
    waiting = list(reqs[:8])
    views.engine_view(waiting, [], LIMITS)
    _apply_as_the_adapter_does(views, waiting, FinalPlan(), states)
    at = np.array([i for i, r in enumerate(waiting) if r.rid in hold]) if by_position else None
    held = [r for r in waiting if r.rid in hold]
    kept = [r for r in waiting if r.rid not in hold]
    views.held_to_tail(hold, at, kept, held)  # the adapter's _slo_admit: the walk runs without them
    waiting[:] = kept[1:] + held  # it admitted the head
    waiting[0].prefix_len = 20  # and stopped at the next one
    waiting.append(reqs[8])  # an arrival, after the held ones
    looked.clear()
    view = views.engine_view(waiting, [], LIMITS)
    assert looked == {waiting[0].rid, "r8"}
    assert [v.rid for v in view.waiting] == [r.rid for r in waiting]
    _assert_known_rows_are_the_views(view)


def test_a_running_batch_that_only_decoded_keeps_its_views_current() -> None:
    """A decode pass finds SGLang's batch as it was, one token longer: the views and rows follow
    the counts; a request not yet started, a re-matched prefix or a changed batch is read whole."""
    views, _ = _builder()
    reqs = [StandInReq(f"r{i}", 30 + i, ttft_ms=500, tpot_ms=50) for i in range(6)]
    running = reqs[:4]
    for req in running[:3]:
        req.customized_info = {TOKEN_TS_KEY: [5.1]}
    passes: list[EngineView] = []
    for step in range(8):
        for req in running:
            if step % 3 != 2 or req is not running[0]:  # one request stalls now and then
                req.output_ids.append(1)
        if step == 2:  # the fourth request's first token arrives
            running[3].customized_info = {TOKEN_TS_KEY: [5.4]}
        if step == 4:  # a running request is re-matched (a new prefix length)
            running[1].prefix_len = 5
        if step == 6:  # the batch changes: one leaves, another joins at the same length
            running[2] = reqs[4]
            reqs[4].customized_info = {TOKEN_TS_KEY: [5.6]}
            reqs[4].output_ids = [1, 1]
        view = views.engine_view(reqs[5:], running, LIMITS)
        _assert_known_rows_are_the_views(view)
        got = [(v.rid, v.generated, v.attained_service, v.first_token_time, v.prefix_cached) for v in view.running]
        assert got == [
            (
                r.rid,
                len(r.output_ids),
                30.0 + int(r.rid[1:]) + len(r.output_ids),
                _first_stamp(r),
                r.prefix_len,
            )
            for r in running
        ]
        passes.append(view)
    assert passes[-1].running[0] is passes[1].running[0]  # the same view, kept across passes


def _first_stamp(req: StandInReq) -> float | None:
    return req.customized_info[TOKEN_TS_KEY][0] if req.customized_info else None


@pytest.mark.parametrize("known", [True, False], ids=["by-row", "by-rid"])
def test_gmax_credits_a_finished_request_and_not_a_retracted_one(known: bool) -> None:
    """GMAX's tuner learns from requests that left both queues: found by row where the builder
    keeps rows, by rid otherwise, with the same outcome."""
    policy = make_policy("gmax", default_model())
    rewarded: list[float] = []
    policy.tuner.reward = rewarded.append  # type: ignore[attr-defined,method-assign]
    views, _ = _builder()
    done, retracted, stays = (
        StandInReq(rid, 40, spec=SloSpec(deadline_ms=60_000, slo_class=SloClass.DEADLINE)) for rid in "drs"
    )
    for req in (done, retracted, stays):
        req.output_ids = [1, 1]
        req.customized_info = {TOKEN_TS_KEY: [5.0, 5.0]}
    for waiting, running in (([], [done, retracted, stays]), ([retracted], [stays])):
        view = views.engine_view(waiting, running, LIMITS)
        policy.plan(view if known else replace(view, known_rows=None))
    assert rewarded == [1.0]  # the finished request alone, worth one met SLO


class _RandomTier:
    """A policy that ranks positions and puts a random part of the queue in the best-effort
    tier every pass, best-effort-class requests included."""

    name = "random_tier"
    slo_levers = True

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def plan(self, view: EngineView) -> StepPlan:
        n = len(view.waiting)
        order_at = self.rng.permutation(n).astype(np.int64)
        tier_at = np.sort(order_at[: self.rng.integers(0, n + 1)]) if n else order_at
        rids = [r.rid for r in view.waiting]
        return StepPlan(
            order=[rids[i] for i in order_at.tolist()],
            best_effort={rids[i] for i in tier_at.tolist()},
            order_at=order_at,
            best_effort_at=tier_at,
        )


@pytest.mark.parametrize("seed", range(6))
def test_the_tier_marked_by_position_is_the_plans_tier(seed: int) -> None:
    """Where the plan gives its tier as positions, the engine marks only what changed (read off
    the views' tier flags, best-effort-class requests looked up): after every pass each waiting
    request is declined iff in the plan's tier, a running one keeps the tier it started in,
    and the next pass's views say so."""
    clock = ManualClock(5.0)
    states = RequestStates()
    views = ViewBuilder(states, clock, CompoundDeadlines())
    policy = _RandomTier(seed)
    settings = replace(settings_for(policy), levers=False)
    reqs = _mixed_requests(40)
    waiting, running = list(reqs[:30]), []
    by_positions = 0
    for step in range(14):
        clock.advance(0.2)
        if waiting and step % 3 == 0:  # the head starts: it keeps the tier it had
            req = waiting.pop(0)
            req.customized_info = {TOKEN_TS_KEY: [clock.now()]}
            running.append(req)
        if step == 6:
            waiting.extend(reqs[30:])
        started_in = {r.rid: states.is_declined(r.rid) for r in running}
        view = views.engine_view(waiting, running, replace(LIMITS, step=step))
        for r in view.waiting:  # the flags the next plan's tier changes are read from
            assert r.best_effort_tier == (r.slo.is_best_effort or states.is_declined(r.rid))
        planned = plan_pass(view, policy, settings)
        by_positions += planned.tier_flips_at is not None
        _apply_as_the_adapter_does(views, waiting, planned, states)
        assert {r.rid for r in waiting if states.is_declined(r.rid)} == set(planned.best_effort)
        assert {r.rid: states.is_declined(r.rid) for r in running} == started_in
    assert by_positions >= 7  # the others dropped requests (queue timeouts): marked by rid
