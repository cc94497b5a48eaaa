"""The view builder keeps one view per request and refreshes only what SGLang changed."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from scheduler.components.request_state import RequestStates
from scheduler.components.views import EngineLimits, ViewBuilder
from scheduler.core.clock import ManualClock
from scheduler.core.columns import ViewColumns
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.types import EngineView
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
    req.prefix_indices = torch.arange(60)  # SGLang re-matched its prefix
    assert views.engine_view([req], [], LIMITS).waiting[0].prefix_cached == 60
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
            waiting[-1].prefix_indices = torch.arange(33)
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
