"""Admission under overload: the `on_infeasible` field, the queue's predicted drain, the
certain-miss check, and how the one plan path applies it under every policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from scheduler.core.admission import SLO_INFEASIBLE_REASON, backlog, certainly_late, retry_after_s, service_order
from scheduler.core.perf_model import constant_model
from scheduler.core.plan_path import DECODE, LeverModel, PlanSettings, finalize_plan
from scheduler.core.policies import make_policy
from scheduler.core.sim import EngineConfig, SimRequest, Simulator
from scheduler.core.slo import SloClass, SloSpec, SloValidationError, parse_slo
from scheduler.core.types import EngineView, RequestView, StepPlan
from tests.unit.core.policy_cases import policy_view, small_gpu

TAU = 0.01
REJECT_TTFT = SloSpec(ttft_ms=50.0, slo_class=SloClass.LATENCY, on_infeasible="reject")


def _view(waiting, running=(), now=0.0, cap=4) -> EngineView:
    """policy_view's roomy engine, with 100-token prefill steps."""
    return replace(policy_view(list(waiting), list(running), cap=cap, now=now), chunk_size=100)


def _req(rid, prompt=100, slo=None, arrival=0.0, **kw) -> RequestView:
    return RequestView(rid=rid, slo=slo or SloSpec(), arrival=arrival, prompt_len=prompt, max_new_tokens=10, **kw)


# -- the field ------------------------------------------------------------------------------


def test_on_infeasible_parses_round_trips_and_names_a_bad_value():
    spec = parse_slo({"ttft_ms": 100, "on_infeasible": "reject"})
    assert spec.rejects_when_infeasible
    assert parse_slo(spec.to_dict()) == spec
    assert not parse_slo({"ttft_ms": 100}).rejects_when_infeasible
    assert "on_infeasible" not in parse_slo({"ttft_ms": 100}).to_dict()  # the default stays off the wire
    with pytest.raises(SloValidationError) as err:
        parse_slo({"ttft_ms": 100, "on_infeasible": "drop"})
    assert err.value.field == "slo.on_infeasible"


# -- the backlog ----------------------------------------------------------------------------


def test_service_order_is_the_adapters_order():
    waiting = [_req(r) for r in "abcd"]
    assert service_order(waiting, ["c", "zz", "a"], {"a"}) == [2, 1, 3, 0]
    assert service_order(waiting, None, ()) == [0, 1, 2, 3]


def test_a_rid_queued_twice_keeps_both_entries_in_the_order():
    waiting = [_req(r) for r in ["a", "b", "a", "c"]]
    assert service_order(waiting, ["c", "a"], ()) == [3, 0, 2, 1]
    assert sorted(service_order(waiting, None, {"a"})) == [0, 1, 2, 3]


def test_the_certain_miss_check_survives_a_rid_queued_twice():
    hogs = [_req(f"h{i}", prompt=1000) for i in range(5)]
    view = _view([*hogs, _req("reject", slo=REJECT_TTFT), _req("reject", slo=REJECT_TTFT)])
    assert certainly_late(view, constant_model(TAU)) == ["reject", "reject"]


def test_prefill_ahead_grows_along_the_queue_and_a_newcomer_waits_for_all():
    # one 100-token chunk per step at TAU: a request waits one step per request ahead of it
    view = _view([_req(r) for r in "abc"], cap=64)
    plan = backlog(view, constant_model(TAU))
    assert list(plan.prefill_ahead_s) == pytest.approx([0.0, TAU, 2 * TAU])
    assert list(plan.start_s) == pytest.approx([0.0, TAU, 2 * TAU])
    assert plan.drain_s == pytest.approx(3 * TAU)


def test_a_full_batch_makes_the_queue_wait_for_slots():
    running = [_req(f"r{i}", generated=1, first_token_time=0.0) for i in range(2)]  # 9 tokens left each
    view = _view([_req("w")], running=running, cap=2)
    plan = backlog(view, constant_model(TAU))
    assert plan.prefill_ahead_s[0] == 0.0
    assert plan.start_s[0] > 5 * TAU  # it waits for a running request's remaining decode steps
    roomy = backlog(_view([_req("w")], running=running, cap=3), constant_model(TAU))
    assert roomy.start_s[0] == 0.0


# -- the certain-miss check -------------------------------------------------------------------


def test_only_rejecting_requests_beyond_reach_are_late():
    hogs = [_req(f"h{i}", prompt=1000) for i in range(5)]  # 50 steps of prefill ahead: 0.5 s
    tail = [
        _req("reject", slo=REJECT_TTFT),
        _req("keep", slo=SloSpec(ttft_ms=50.0, slo_class=SloClass.LATENCY)),
        _req("no-slo", slo=SloSpec(on_infeasible="reject")),
    ]
    view = _view([*hogs, *tail])
    assert certainly_late(view, constant_model(TAU)) == ["reject"]
    # put first by the policy's order, the same request can still make it
    assert certainly_late(view, constant_model(TAU), order=["reject"]) == []


def test_without_a_trusted_model_only_a_passed_due_time_counts():
    view = _view([_req(f"h{i}", prompt=1000) for i in range(5)] + [_req("reject", slo=REJECT_TTFT)])
    assert certainly_late(view, None) == []
    assert certainly_late(_view(view.waiting, now=0.06), None) == ["reject"]


def test_the_margin_forgives_a_small_overshoot():
    # own prefill is one step (10 ms) after 4 steps ahead: 50 ms, due at 50 ms
    view = _view([_req(f"h{i}") for i in range(4)] + [_req("reject", slo=REJECT_TTFT)])
    assert certainly_late(view, constant_model(TAU)) == []
    assert certainly_late(view, constant_model(TAU * 1.05), margin=0.0) == ["reject"]
    assert certainly_late(view, constant_model(TAU * 1.05)) == []


def test_deadline_requests_are_judged_by_their_deadline():
    slo = SloSpec(deadline_ms=30.0, slo_class=SloClass.DEADLINE, on_infeasible="reject")
    view = _view([_req(f"h{i}") for i in range(5)] + [_req("d", slo=slo)])
    assert certainly_late(view, constant_model(TAU)) == ["d"]


def test_retry_after_is_whole_seconds_and_never_zero():
    assert retry_after_s(0.0) == 1
    assert retry_after_s(1.2) == 2
    assert retry_after_s(None) == 1
    assert retry_after_s(float("inf")) == 1


# -- the plan path ----------------------------------------------------------------------------


def test_the_plan_path_drops_certain_misses_with_their_wait_under_any_policy():
    view = _view([_req(f"h{i}", prompt=1000) for i in range(5)] + [_req("reject", slo=REJECT_TTFT)])
    stock = PlanSettings(apply_levers=False, levers=False)  # fcfs: the engine is left as SGLang's
    plan = finalize_plan(view, StepPlan(), stock, LeverModel(constant_model(TAU)))
    assert plan.drop == {"reject": SLO_INFEASIBLE_REASON}
    assert plan.waits["reject"] == pytest.approx(50 * TAU)
    assert finalize_plan(view, StepPlan(), stock, None).drop == {}  # no trusted model: not certain
    assert finalize_plan(view, StepPlan(), PlanSettings(role=DECODE), LeverModel(constant_model(TAU))).drop == {}


def test_a_queue_timeout_drop_gets_a_wait_from_the_wait_model():
    slo = SloSpec(max_queue_ms=10.0)
    view = _view([_req("h", prompt=1000), _req("late", slo=slo)], now=1.0)
    plan = finalize_plan(view, StepPlan(), PlanSettings(), None, wait_model=constant_model(TAU))
    assert plan.drop == {"late": "slo_queue_timeout"}
    assert plan.waits["late"] == pytest.approx(10 * TAU)


@pytest.mark.parametrize("policy", ["fcfs", "edf"])
def test_every_rejected_request_would_have_missed_anyway(policy):
    """The check promises certainty: in the same run without `reject`, each request it rejected
    misses its TTFT (rejecting others only gives it less work ahead)."""

    def workload(on_infeasible: str) -> list[SimRequest]:
        slo = SloSpec(ttft_ms=200.0, slo_class=SloClass.LATENCY, on_infeasible=on_infeasible)
        return [SimRequest(f"r{i}", slo, 0.002 * i, prompt_len=400, output_len=8) for i in range(80)]

    cfg = EngineConfig(max_running_requests=16, chunk_size=512)
    rejected = Simulator(make_policy(policy), small_gpu(), cfg).run(workload("reject"))
    kept = Simulator(make_policy(policy), small_gpu(), cfg).run(workload("best_effort"))
    shed = {rid for rid, rec in rejected.records.items() if rec.drop_reason == SLO_INFEASIBLE_REASON}
    assert shed, "the burst should exceed what a 200 ms TTFT allows"
    outcomes = kept.outcomes()
    assert all(outcomes[rid].ttft_ok is False for rid in shed)
    admitted = [o for rid, o in rejected.outcomes().items() if rid not in shed]
    assert sum(o.attained for o in admitted) >= sum(o.attained for o in outcomes.values())
