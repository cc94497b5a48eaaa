"""Fair shares between tenants on the plan path (scheduler/core/fairness.py): a single tenant
plans exactly as before, and a flood from one tenant (even with the tightest SLOs) does not
starve another, in the plan and in the simulator that runs the same plan path."""

from __future__ import annotations

import pytest

from scheduler.core.fairness import FairShare
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from scheduler.core.plan_path import LeverModel, PlanSettings, plan_pass, settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim import EngineConfig, SimRequest, Simulator
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView

PERF = RooflinePerfModel([RooflineTerm(k_tokens=1e-4, k_spec=0.0, k_kv=0.0, b=0.01)])
GREEDY = SloSpec(ttft_ms=0.001, slo_class=SloClass.LATENCY)  # "always first" under edf
PATIENT = SloSpec(ttft_ms=1000.0, slo_class=SloClass.LATENCY)


def _req(rid: str, tenant: str | None, slo: SloSpec, arrival: float = 0.0, share: float = 1.0) -> RequestView:
    return RequestView(rid=rid, slo=slo, arrival=arrival, prompt_len=100, max_new_tokens=50, tenant=tenant, share=share)


def _view(waiting: list[RequestView], running: list[RequestView] = ()) -> EngineView:
    return EngineView(
        now=0.0,
        waiting=waiting,
        running=list(running),
        max_running_requests=8,
        chunk_size=512,
        free_kv_tokens=10**6,
        total_kv_tokens=10**6,
    )


def _flood() -> list[RequestView]:
    """Tenant a: 40 requests asking ttft 0.001 ms; tenant b: 10 patient ones, arrived first."""
    return [_req(f"b{i}", "b", PATIENT, arrival=0.0) for i in range(10)] + [
        _req(f"a{i}", "a", GREEDY, arrival=0.001 * (i + 1)) for i in range(40)
    ]


@pytest.mark.parametrize("policy", ["edf", "sjf", "las", "tempo", "gmax", "slos"])
@pytest.mark.parametrize("tenant", [None, "only"])
def test_one_tenant_plans_exactly_as_without_the_blend(policy: str, tenant: str | None) -> None:
    waiting = [_req(f"r{i}", tenant, GREEDY if i % 3 else PATIENT, arrival=0.01 * i) for i in range(30)]
    running = [_req(f"x{i}", tenant, PATIENT) for i in range(3)]
    off = plan_pass(_view(waiting, running), make_policy(policy), PlanSettings(tenant_fairness=0.0), LeverModel(PERF))
    fair = FairShare()
    for _ in range(3):  # counters build up over passes: still nothing changes
        on = plan_pass(_view(waiting, running), make_policy(policy), PlanSettings(), LeverModel(PERF), fair=fair)
        assert on.order == off.order and on.drop == off.drop and on.best_effort == off.best_effort


def test_edf_alone_puts_the_whole_flood_first() -> None:
    plan = plan_pass(_view(_flood()), make_policy("edf"), PlanSettings(tenant_fairness=0.0), LeverModel(PERF))
    assert plan.order is not None and all(rid.startswith("a") for rid in plan.order[:40])


def _served_a() -> list[RequestView]:
    """a's requests already running: a has been served, b not yet."""
    running = [_req(f"ar{i}", "a", GREEDY) for i in range(4)]
    for r in running:
        r.generated = 10
    return running


def _first_b(fairness: float) -> int:
    settings = PlanSettings(tenant_fairness=fairness)
    plan = plan_pass(_view(_flood(), _served_a()), make_policy("edf"), settings, LeverModel(PERF), fair=FairShare())
    assert plan.order is not None and sorted(plan.order) == sorted(r.rid for r in _flood())
    # each tenant's own requests keep the policy's order
    assert [r for r in plan.order if r.startswith("a")] == [f"a{i}" for i in range(40)]
    assert [r for r in plan.order if r.startswith("b")] == [f"b{i}" for i in range(10)]
    return next(i for i, rid in enumerate(plan.order) if rid.startswith("b"))


def test_the_blend_moves_the_tenant_behind_its_share_to_the_front_with_f() -> None:
    """priority' = (1 - f)·(1 - rank/50) + f·Fair; b is behind (Fair 1, a 0) and edf ranks b0
    41st (priority 0.2): with f = 0.3, a's first 19 still pass it; with f >= 0.5 none does."""
    assert [_first_b(f) for f in (0.0, 0.3, 0.5, 1.0)] == [40, 19, 0, 0]


def test_even_counters_keep_the_policys_order() -> None:
    """Nobody served yet: nobody is behind, edf's order stands."""
    plan = plan_pass(
        _view(_flood()), make_policy("edf"), PlanSettings(tenant_fairness=1.0), LeverModel(PERF), fair=FairShare()
    )
    assert plan.order is not None and all(rid.startswith("a") for rid in plan.order[:40])


def test_a_larger_share_is_charged_less_per_token() -> None:
    fair = FairShare()
    a_run, b_run = _req("a-run", "a", PATIENT, share=2.0), _req("b-run", "b", PATIENT)
    a_run.generated, b_run.generated = 100, 50  # a: 200 tokens over share 2; b: 150 over 1
    waiting = [_req("a0", "a", PATIENT, share=2.0), _req("b0", "b", PATIENT)]
    view = _view(waiting, [a_run, b_run])
    plan = fair.blend(view, make_policy("edf").plan(view), 1.0)
    assert sorted(fair.counters().values()) == [0.0, 50.0]  # b is 50 tokens-per-share ahead
    assert plan.order is not None and list(plan.order) == ["a0", "b0"]


def test_a_tenant_back_from_idle_banks_no_credit() -> None:
    fair = FairShare()
    a_run = _req("a-run", "a", PATIENT)
    for generated in (10, 200, 400):  # a alone, served for a long while
        a_run.generated = generated
        view = _view([_req("a0", "a", PATIENT)], [a_run])
        fair.blend(view, make_policy("edf").plan(view), 1.0)
    a_run.generated = 410
    waiting = [_req("a0", "a", PATIENT), _req("b0", "b", PATIENT)]
    view = _view(waiting, [a_run])
    fair.blend(view, make_policy("edf").plan(view), 1.0)
    counters = sorted(fair.counters().values())
    assert counters[1] - counters[0] <= 10.0  # b starts level with a, not 500 tokens behind it


def _sim(fairness: float) -> dict[str, list[float]]:
    """Both tenants send everything at once; a asks for the tightest TTFT and sends 4x as many."""
    reqs = [SimRequest(f"a{i}", GREEDY, 0.0, 200, 20, max_new_tokens=20, tenant="a") for i in range(80)] + [
        SimRequest(f"b{i}", PATIENT, 0.0, 200, 20, max_new_tokens=20, tenant="b") for i in range(20)
    ]
    policy = make_policy("edf")
    settings = PlanSettings(**{**settings_for(policy).__dict__, "tenant_fairness": fairness})
    sim = Simulator(policy, PERF, EngineConfig(max_running_requests=4, chunk_size=512), settings=settings)
    result = sim.run(reqs)
    done: dict[str, list[float]] = {"a": [], "b": []}
    for rid, rec in result.records.items():
        assert rec.finished
        done[rid[0]].append(rec.token_times[0])
    return done


def test_in_the_simulator_a_flood_does_not_starve_the_other_tenant() -> None:
    alone, blended = _sim(0.0), _sim(0.5)
    first_b_alone, first_b_blended = min(alone["b"]), min(blended["b"])
    assert first_b_alone > max(alone["a"]) * 0.9  # edf alone: b waits for the whole flood
    assert first_b_blended < min(first_b_alone, sorted(blended["a"])[10])  # b starts among a's first
    # by the time half the requests have started, b (a fifth of the demand, half the share) mostly has
    half = sorted(blended["a"] + blended["b"])[50]
    assert sum(t <= half for t in blended["b"]) >= 15
    assert sum(t <= sorted(alone["a"] + alone["b"])[50] for t in alone["b"]) == 0
