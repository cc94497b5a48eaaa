"""Baseline policies (SJF, LAS, Sarathi), the registry, the simulator, and plan invariants that
every registered policy must keep."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.perf_model import constant_model
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.policies.las import LasParams, LasPolicy
from scheduler.core.policies.sarathi import SarathiParams, SarathiPolicy
from scheduler.core.policies.sjf import SjfParams, SjfPolicy
from scheduler.core.registry import ParamError
from scheduler.core.sim import EngineConfig, SimRequest, Simulator
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView
from tests.unit.core.policy_cases import TAU, d1_run, engine_views, policy_view, run_single_slot, waiting_picks

NEW_POLICIES = ("sjf", "las", "sarathi", "tempo", "gmax")


def _view(waiting, running=(), cap=4, chunk=512, step=0, now=10.0) -> EngineView:
    return policy_view(waiting, running, cap=cap, step=step, now=now, chunk=chunk, free_kv=10_000, total_kv=20_000)


def _replaced(view: EngineView, old: RequestView, new: RequestView) -> EngineView:
    return replace(view, waiting=[new if r is old else r for r in view.waiting])


def _never_earlier(policy, view: EngineView, target: RequestView, changed: RequestView) -> bool:
    """A monotonicity property: `target` changed into `changed` (less deserving under the
    policy's rule) is ordered no earlier than before."""
    after = policy.plan(_replaced(view, target, changed)).order.index(target.rid)
    return after >= policy.plan(view).order.index(target.rid)


def _req(rid, arrival=0.0, **kw) -> RequestView:
    kw.setdefault("slo", SloSpec())
    kw.setdefault("prompt_len", 16)
    return RequestView(rid=rid, arrival=arrival, **kw)


# -- registry --------------------------------------------------------------------------------


def test_registry_has_the_new_policies_and_rejects_unknown_parameters():
    for name in NEW_POLICIES:
        assert make_policy(name).name == name
    with pytest.raises(ParamError, match="takes no parameter 'no_such_knob'"):
        make_policy("tempo", no_such_knob=1)


# -- invariants for every registered policy ----------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(view=engine_views(), name=st.sampled_from(sorted(POLICIES)))
def test_plan_invariants(view, name):
    plan = make_policy(name).plan(view)
    waiting = [r.rid for r in view.waiting]
    running = {r.rid for r in view.running}
    assert set(plan.drop) <= set(waiting)
    if plan.order is not None:
        # every waiting rid that is not dropped appears exactly once, and nothing else does
        assert sorted(plan.order) == sorted(r for r in waiting if r not in plan.drop)
    assert len(set(plan.preempt)) == len(plan.preempt) and set(plan.preempt) <= running
    assert plan.best_effort <= set(waiting)
    if plan.chunk_size is not None:
        assert 1 <= plan.chunk_size <= view.chunk_size
    if plan.batch_cap is not None:
        assert plan.batch_cap >= 1


@settings(max_examples=30, deadline=None)
@given(view=engine_views(), name=st.sampled_from(NEW_POLICIES))
def test_plans_are_deterministic(view, name):
    assert make_policy(name).plan(view) == make_policy(name).plan(view)


# -- SJF -------------------------------------------------------------------------------------


def test_sjf_ranks_by_predicted_remaining_with_fallbacks():
    reqs = [
        _req("pred50", predicted_output_len=50.0, max_new_tokens=1000),
        _req("cap20", max_new_tokens=20),  # no prediction: the client's cap
        _req("default"),  # neither: the configured default
        _req("pred400_gen390", predicted_output_len=400.0, generated=390, first_token_time=1.0),
        _req("capped", predicted_output_len=5000.0, max_new_tokens=30),  # cap bounds the prediction
    ]
    order = SjfPolicy(SjfParams(default_output_len=100)).plan(_view(reqs)).order
    assert order == ["pred400_gen390", "cap20", "capped", "pred50", "default"]


def test_sjf_ties_break_by_arrival():
    reqs = [_req("late", arrival=2.0, max_new_tokens=10), _req("early", arrival=1.0, max_new_tokens=10)]
    assert SjfPolicy().plan(_view(reqs)).order == ["early", "late"]


def test_sjf_never_sees_the_true_length_in_simulation():
    # The prediction says "short" for the truly long request: SJF must follow the prediction.
    slo = SloSpec()
    reqs = [
        SimRequest("truly_long", slo, 0.0, 4, output_len=40, predicted_output_len=2.0),
        SimRequest("truly_short", slo, 0.0, 4, output_len=2, predicted_output_len=30.0),
    ]
    res = Simulator(SjfPolicy(), constant_model(TAU), EngineConfig(max_running_requests=1)).run(reqs)
    assert res.records["truly_long"].finish_time < res.records["truly_short"].finish_time


@settings(max_examples=40, deadline=None)
@given(picked=waiting_picks(), extra=st.floats(1.0, 5000.0))
def test_sjf_longer_prediction_never_moves_a_request_earlier(picked, extra):
    view, target = picked
    # Uncapped, with a prediction, so the added length is visible to SJF.
    base_t = replace(target, predicted_output_len=target.predicted_output_len or 100.0, max_new_tokens=None)
    longer = replace(base_t, predicted_output_len=base_t.predicted_output_len + extra)
    base = _replaced(view, target, base_t)
    assert _never_earlier(SjfPolicy(), base, base_t, longer)


# -- LAS -------------------------------------------------------------------------------------


def test_las_serves_least_attained_program_first_fcfs_within_a_level():
    reqs = [
        _req("old_prog", arrival=0.0, attained_service=5000.0),
        _req("fresh_b", arrival=2.0, attained_service=10.0),
        _req("fresh_a", arrival=1.0, attained_service=100.0),
    ]
    assert LasPolicy().plan(_view(reqs)).order == ["fresh_a", "fresh_b", "old_prog"]
    assert LasPolicy(LasParams(level_thresholds=None)).plan(_view(reqs)).order == ["fresh_b", "fresh_a", "old_prog"]


def test_las_promotes_starving_requests():
    reqs = [_req("hog", arrival=0.0, attained_service=1e6), _req("new", arrival=99.0)]
    assert LasPolicy(LasParams(starvation_s=30.0)).plan(_view(reqs, now=100.0)).order == ["hog", "new"]
    assert LasPolicy(LasParams(starvation_s=None)).plan(_view(reqs, now=100.0)).order == ["new", "hog"]


def test_las_preempts_worse_level_only_at_quanta():
    running = [_req("long_prog", attained_service=1e5, generated=10, first_token_time=1.0)]
    waiting = [_req("new", arrival=5.0)]
    pol = LasPolicy(LasParams(quantum_steps=20))
    assert pol.plan(_view(waiting, running, cap=1, step=40)).preempt == ["long_prog"]
    assert pol.plan(_view(waiting, running, cap=1, step=41)).preempt == []
    assert pol.plan(_view(waiting, running, cap=2, step=40)).preempt == []  # a free slot: no need


@settings(max_examples=40, deadline=None)
@given(picked=waiting_picks(), extra=st.floats(1.0, 1e6))
def test_las_more_attained_service_never_moves_earlier(picked, extra):
    view, t = picked
    more_served = replace(t, attained_service=t.attained_service + extra)
    assert _never_earlier(LasPolicy(LasParams(starvation_s=None)), view, t, more_served)


# -- Sarathi ---------------------------------------------------------------------------------


def test_sarathi_budget_is_shared_with_decodes_and_order_is_fcfs():
    running = [_req(f"r{i}", generated=3, first_token_time=1.0) for i in range(100)]
    waiting = [_req("b", arrival=2.0), _req("a", arrival=1.0)]
    plan = SarathiPolicy(SarathiParams(token_budget=512)).plan(_view(waiting, running, cap=256, chunk=8192))
    assert plan.order == ["a", "b"]
    assert plan.chunk_size == 412
    assert SarathiPolicy(SarathiParams(token_budget=512)).plan(_view(waiting, [], chunk=256)).chunk_size == 256
    assert SarathiPolicy(SarathiParams(token_budget=64)).plan(_view(waiting, running, cap=256)).chunk_size == 1
    assert (
        SarathiPolicy(SarathiParams(token_budget=512, count_decodes=False))
        .plan(_view(waiting, running, cap=256))
        .chunk_size
        == 512
    )


def test_sarathi_chunks_long_prompts_in_simulation():
    # A 300-token prompt under a 100-token budget needs 3 iterations before its first token.
    reqs = [SimRequest("p", SloSpec(), 0.0, 300, output_len=1)]
    res = Simulator(
        SarathiPolicy(SarathiParams(token_budget=100)), constant_model(TAU), EngineConfig(chunk_size=512)
    ).run(reqs)
    assert res.records["p"].token_times == [3 * TAU]


# -- JITServe App. D.1: EDF and SJF only reach N ---------------------------------------------


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("name", ["edf", "sjf"])
def test_d1_edf_and_sjf_only_get_the_small_requests(name, n):
    goodput, a_served = d1_run(make_policy(name), n)
    assert goodput == pytest.approx(n) and not a_served  # every B_i (R = 1), A misses


# -- simulator -------------------------------------------------------------------------------


def test_sim_token_timing_and_resume_after_preemption_keeps_tokens():
    class PreemptOnce:
        name = "preempt_once"
        slo_levers = True

        def plan(self, view):
            from scheduler.core.types import StepPlan

            if view.step == 3 and view.running:
                return StepPlan(preempt=[view.running[0].rid], order=[view.running[0].rid])
            return StepPlan()

    # The engine plans only while a request waits (as the adapter does): "y" keeps the queue
    # non-empty behind the one batch slot, and the plan resumes "x" ahead of it.
    reqs = [SimRequest("x", SloSpec(), 0.0, 8, output_len=6), SimRequest("y", SloSpec(), 0.001, 8, output_len=1)]
    res = Simulator(PreemptOnce(), constant_model(TAU), EngineConfig(max_running_requests=1)).run(reqs)
    rec = res.records["x"]
    assert len(rec.token_times) == 6 and rec.preemptions == 1
    # tokens at steps 1,2,3; step 4 recomputes the context and emits token 4; then 5, 6.
    assert rec.token_times == [k * TAU for k in (1, 2, 3, 4, 5, 6)]


def test_sim_drops_and_reports_queue_timeouts():
    slo = SloSpec(deadline_ms=10_000, slo_class=SloClass.DEADLINE, max_queue_ms=1.0)
    reqs = [SimRequest("hog", SloSpec(), 0.0, 4, output_len=50), SimRequest("late", slo, 0.001, 4, output_len=2)]
    res = run_single_slot(make_policy("gmax"), reqs)
    assert res.records["late"].drop_reason == "slo_queue_timeout"
    assert not res.outcomes()["late"].finished
