"""The adapter reads the tenant the HTTP edge wrote (custom_params slo_tenant/slo_share) into its
views, and its planner blends the policy's order with the tenants' fair shares, as the simulator
does: a tenant already served waits behind one that was not."""

from __future__ import annotations

from scheduler.components.planner import PassPlanner
from scheduler.components.request_state import RequestStates, request_tenant
from scheduler.components.views import EngineLimits, ViewBuilder
from scheduler.core.clock import ManualClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.perf_model import default_model
from scheduler.core.plan_path import LeverModel, settings_for
from scheduler.core.policies import make_policy
from tests.unit.scheduler._stand_in_engine import StandInReq
from wire import SHARE_PARAM, TENANT_PARAM

LIMITS = EngineLimits(max_running_requests=8, chunk_size=512, free_kv_tokens=10_000, total_kv_tokens=20_000, step=3)


def _req(rid: str, tenant: str, ttft_ms: float, share: object = 1.0) -> StandInReq:
    return StandInReq(rid, 50, ttft_ms=ttft_ms, custom={TENANT_PARAM: tenant, SHARE_PARAM: share})


def test_views_carry_the_tenant_and_a_bad_share_reads_as_one() -> None:
    views = ViewBuilder(RequestStates(), ManualClock(5.0), CompoundDeadlines())
    reqs = [_req("a", "tenant-a", 500, share=2.5), _req("b", "tenant-b", 500, share="lots"), StandInReq("c", 50, 500)]
    waiting = views.engine_view(reqs, [], LIMITS).waiting
    assert [(v.tenant, v.share) for v in waiting] == [("tenant-a", 2.5), ("tenant-b", 1.0), (None, 1.0)]
    assert request_tenant(reqs[1].sampling_params) == ("tenant-b", 1.0)


def test_the_adapters_planner_puts_the_tenant_behind_its_share_first() -> None:
    views = ViewBuilder(RequestStates(), ManualClock(5.0), CompoundDeadlines())
    policy = make_policy("edf")
    planner = PassPlanner(policy, settings_for(policy))
    served = _req("a-run", "a", 100)
    served.output_ids = list(range(40))
    greedy = [_req(f"a{i}", "a", 1) for i in range(5)]  # edf alone: all of them first
    patient = [_req(f"b{i}", "b", 2000) for i in range(2)]
    view = views.engine_view([*greedy, *patient], [served], LIMITS)
    plan = planner.plan(view, LeverModel(default_model()))
    assert plan is not None and plan.order is not None
    assert list(plan.order[:2]) == ["b0", "b1"] and list(plan.order[2:]) == [f"a{i}" for i in range(5)]
    off = PassPlanner(policy, settings_for(policy, tenant_fairness=0.0)).plan(view, LeverModel(default_model()))
    assert off is not None and off.order is not None and list(off.order[:5]) == [f"a{i}" for i in range(5)]
