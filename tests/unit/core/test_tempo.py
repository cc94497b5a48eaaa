"""Tempo LSDF: density ranking, stage-max remaining work, best-effort reserve, fairness blend,
quantum-only and cost-checked preemption, and JITServe's App. D.1 constructions."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.perf_model import constant_model
from scheduler.core.policies.tempo import TempoParams, TempoPolicy, reserved_slots
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import RequestView
from tests.unit.core.policy_cases import (
    TAU,
    best_effort_finishes,
    d1_run,
    deadline_request,
    engine_views,
    latency_burst,
    policy_view,
    preempts_only_every,
    small_gpu,
    stage_behind_its_sub_deadline,
    with_weight,
)

DL = SloClass.DEADLINE


# -- App. D.1: LSDF gets M where EDF/SJF get N ------------------------------------------------


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("b_slack", [1.0, 1.5])  # SJF instance (SLO = δ) and EDF instance
def test_d1_lsdf_serves_the_valuable_request(n, b_slack):
    goodput, a_served = d1_run(TempoPolicy(perf_model=constant_model(TAU)), n, b_slack)
    assert goodput == pytest.approx(10.0 * n * (n + 2)) and a_served  # M = R(A)


# -- density ---------------------------------------------------------------------------------


def test_urgent_latency_request_outranks_a_far_deadline():
    lat = RequestView(
        rid="chat", slo=SloSpec(ttft_ms=200, tpot_ms=50, slo_class=SloClass.LATENCY), arrival=0.0, prompt_len=100
    )
    far = deadline_request("batch", deadline_ms=600_000, prompt=100, out=100)
    assert TempoPolicy().plan(policy_view([far, lat])).order == ["chat", "batch"]


def _chat(rid: str, ttft_ms: float, tpot_ms: float, prompt: int = 100, out: float = 50.0) -> RequestView:
    slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
    return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=prompt, predicted_output_len=out)


def test_a_waiting_chat_request_whose_answer_runs_short_starts_first():
    """Two first tokens due at the same time: the one whose whole token schedule ends sooner
    starts first (a share of the decode span counts in the budget); by the first token's due
    time alone they tie and arrival order decides."""
    long_span, short_span = _chat("long", 1_000, 100, out=400), _chat("short", 1_000, 20, out=40)
    view = policy_view([long_span, short_span], now=0.1)
    assert TempoPolicy().plan(view).order == ["short", "long"]
    assert TempoPolicy(TempoParams(decode_span_share=0.0)).plan(view).order == ["long", "short"]


def test_the_request_objective_does_not_rank_long_prompts_first():
    """Eq. 1's gain grows with the prompt, so under "tokens" the long prompt goes first; every
    request meeting its SLO counts the same under the server's "requests"."""
    big, small = _chat("big", 500, 50, prompt=4_000), _chat("small", 400, 50, prompt=100)
    view = policy_view([big, small], now=0.1)
    assert TempoPolicy(TempoParams(objective="tokens")).plan(view).order == ["big", "small"]
    assert TempoPolicy().plan(view).order == ["small", "big"]


def test_far_deadline_gets_less_density_than_near_one_just_enough_bandwidth():
    near = deadline_request("near", deadline_ms=5_000)
    far = deadline_request("far", deadline_ms=500_000)
    d = TempoPolicy().densities(policy_view([near, far]))
    assert d[0] > 10 * d[1]


def test_hopeless_deadline_is_degraded_by_f():
    # Same request, one whose deadline can no longer be met: gain cut by f = SLO / TTLT.
    ok = deadline_request("ok", deadline_ms=60_000, out=1000)
    late = deadline_request("late", deadline_ms=100, out=1000)
    d = TempoPolicy(TempoParams(alpha=1.0)).densities(policy_view([ok, late]))
    d_step = TempoPolicy(TempoParams(alpha=50.0)).densities(policy_view([ok, late]))
    assert d_step[1] < d[1]  # a harsher α punishes the late one more


def test_compound_stage_uses_the_slowest_sibling():
    def call(rid, out):
        slo = SloSpec(deadline_ms=2_000, slo_class=SloClass.COMPOUND, program_id="prog", stage=1)
        return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=10, predicted_output_len=out, program_arrival=0.0)

    pol = TempoPolicy(perf_model=small_gpu())
    alone = pol.densities(policy_view([call("short", 10)]))[0]
    with_sibling = pol.densities(policy_view([call("short", 10), call("long", 1000)]))[0]
    assert with_sibling < alone


def test_a_stage_behind_its_sub_deadline_is_urgent_not_lost_while_its_program_can_finish():
    view = policy_view([stage_behind_its_sub_deadline(), deadline_request("other", out=100)], now=1.0)
    by_program, by_stage = TempoPolicy(), TempoPolicy(TempoParams(stage_deadlines=True))
    plan = by_program.plan(view)
    assert plan.order is not None and plan.order[0] == "stage" and plan.best_effort == set()
    assert by_program.densities(view)[0] > by_stage.densities(view)[0] > 0  # the gain is the program's
    assert by_stage.plan(view).best_effort == {"stage"}  # the literal sub-deadline defers it


@settings(max_examples=60, deadline=None)
@given(view=engine_views(), factor=st.floats(1.0, 50.0), pick=st.integers(0, 100), fairness=st.sampled_from([0, 0.5]))
def test_higher_weight_never_lowers_density_or_rank(view, factor, pick, fairness):
    reqs = [*view.waiting, *view.running]
    if not reqs:
        return
    target = reqs[pick % len(reqs)]
    pol = TempoPolicy(TempoParams(fairness=fairness))
    i = [r.rid for r in reqs].index(target.rid)
    bumped = with_weight(view, target.rid, factor)
    assert pol.densities(bumped)[i] >= pol.densities(view)[i] * (1 - 1e-12)
    if target in view.waiting:
        assert pol.plan(bumped).order.index(target.rid) <= pol.plan(view).order.index(target.rid)


# -- best-effort reserve ---------------------------------------------------------------------


def test_reserved_slots_average_the_share():
    assert sum(reserved_slots(q * 20, 20, 0.1, 4) for q in range(10)) == 4
    assert [reserved_slots(q * 20, 20, 0.25, 8) for q in range(3)] == [2, 2, 2]
    assert reserved_slots(0, 20, 0.0, 8) == 0
    assert all(reserved_slots(s, 20, 1.0, 3) == 3 for s in range(0, 100, 7))


def test_best_effort_is_admitted_inside_the_reserve_and_last_otherwise():
    be = RequestView(rid="be", slo=SloSpec(), arrival=0.0, prompt_len=10)
    slo = deadline_request("slo", deadline_ms=1_000)
    # A batch of two, half reserved: the best-effort request has one of the two slots.
    assert TempoPolicy(TempoParams(reserve_share=0.5)).plan(policy_view([slo, be], cap=2)).order[:2] == ["slo", "be"]
    slo2 = deadline_request("slo2", deadline_ms=1_000)
    assert TempoPolicy(TempoParams(reserve_share=0.0)).plan(policy_view([slo, be, slo2], cap=2)).order == [
        "slo",
        "slo2",
        "be",
    ]
    running_be = RequestView(rid="be0", slo=SloSpec(), arrival=0.0, prompt_len=10, generated=1, first_token_time=0.1)
    # The reserve (one slot) is already used by a running best-effort request: backfill with SLO work.
    assert TempoPolicy(TempoParams(reserve_share=0.5)).plan(
        policy_view([slo, be, slo2], [running_be], cap=3)
    ).order == ["slo", "slo2", "be"]


def test_the_reserve_is_a_share_of_the_batch_that_runs_not_of_max_running():
    """The engine may admit far fewer requests than max_running_requests (the plan path's
    TPOT cap, memory, a prefill budget): however many it admits, best-effort requests take
    their share of that batch, not all of it (ranked ahead of every SLO request with the whole
    max_running_requests' reserve, they filled a capped batch on their own)."""
    be = [RequestView(rid=f"be{i}", slo=SloSpec(), arrival=0.0, prompt_len=10) for i in range(30)]
    slo = [deadline_request(f"s{i}", deadline_ms=1_000) for i in range(30)]
    order = TempoPolicy(TempoParams(reserve_share=0.1)).plan(policy_view(slo + be, cap=256)).order
    last_slo = max(i for i, r in enumerate(order) if r.startswith("s"))
    for admitted in range(1, last_slo + 1):  # beyond the SLO work, best-effort requests backfill
        head = order[:admitted]
        assert sum(r.startswith("be") for r in head) <= reserved_slots(0, 20, 0.1, admitted)
    assert any(r.startswith("be") for r in order[:12])  # and the reserve is still there


@pytest.mark.parametrize(("share", "runs"), [(0.0, False), (0.1, True)])
def test_best_effort_is_not_starved_with_a_reserve(share, runs):
    pol = TempoPolicy(TempoParams(reserve_share=share), perf_model=constant_model(TAU))
    assert best_effort_finishes(pol) is runs


# -- fairness --------------------------------------------------------------------------------


def test_fairness_one_serves_least_attained_first():
    rich = deadline_request("rich", deadline_ms=1_000, attained_service=1e5)  # dense but already well served
    poor = deadline_request("poor", deadline_ms=100_000, attained_service=0.0)
    assert TempoPolicy(TempoParams(fairness=0.0)).plan(policy_view([rich, poor])).order == ["rich", "poor"]
    assert TempoPolicy(TempoParams(fairness=1.0)).plan(policy_view([rich, poor])).order == ["poor", "rich"]


# -- preemption ------------------------------------------------------------------------------


def _preempt_case(victim_prompt: int):
    running = deadline_request("bulk", deadline_ms=1_000_000, prompt=victim_prompt, generated=5, first_token_time=0.5)
    urgent = RequestView(rid="chat", slo=SloSpec(ttft_ms=200, slo_class=SloClass.LATENCY), arrival=1.0, prompt_len=100)
    return [urgent], [running]


def test_preemption_happens_when_it_pays_and_only_at_quanta():
    waiting, running = _preempt_case(victim_prompt=10)
    pol = TempoPolicy(TempoParams(quantum_steps=20))
    assert pol.plan(policy_view(waiting, running, cap=1, step=40, now=1.0)).preempt == ["bulk"]
    assert pol.plan(policy_view(waiting, running, cap=1, step=41, now=1.0)).preempt == []
    assert pol.plan(policy_view(waiting, running, cap=2, step=40, now=1.0)).preempt == []  # free slot
    assert (
        TempoPolicy(TempoParams(preempt=False)).plan(policy_view(waiting, running, cap=1, step=40, now=1.0)).preempt
        == []
    )


def test_preemption_is_refused_when_the_stall_costs_more():
    """In service gain (Eq. 1), the victim's million prompt tokens outweigh the chat request."""
    waiting, running = _preempt_case(victim_prompt=1_000_000)  # rebuilding its KV stalls the batch
    tokens = TempoPolicy(TempoParams(objective="tokens"))
    assert tokens.plan(policy_view(waiting, running, cap=1, step=40, now=1.0)).preempt == []


@settings(max_examples=60, deadline=None)
@given(view=engine_views(), quantum=st.integers(2, 50))
def test_never_preempts_off_quantum(view, quantum):
    assert preempts_only_every(TempoPolicy(TempoParams(quantum_steps=quantum)), view, quantum)


def test_densities_are_finite_and_nonnegative():
    reqs = [deadline_request(f"r{i}", deadline_ms=float(10 ** (i % 6 + 1)), out=i + 1) for i in range(50)]
    d = TempoPolicy().densities(policy_view(reqs, now=0.5))
    assert np.all(np.isfinite(d)) and np.all(d >= 0)


@pytest.mark.parametrize("defer_backlogged, tier, order", [(False, set(), "ABC"), (True, {"B"}, "ACB")])
def test_a_first_token_the_prefills_ahead_make_late_runs_after_the_one_it_would_make_late(
    defer_backlogged, tier, order
):
    # B's TTFT fits its prefill alone but not behind A's; C's fits behind A's alone.
    view = latency_burst((400.0, 140.0, 200.0))
    plan = TempoPolicy(TempoParams(defer_backlogged=defer_backlogged), perf_model=small_gpu()).plan(view)
    assert set(plan.best_effort) == tier
    assert "".join(plan.order) == order
