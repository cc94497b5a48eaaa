"""The view builder keeps one view per request and refreshes only what SGLang changed."""

from __future__ import annotations

import torch

from scheduler.components.request_state import RequestStates
from scheduler.components.views import EngineLimits, ViewBuilder
from scheduler.core.clock import ManualClock
from scheduler.core.compound import CompoundDeadlines
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
