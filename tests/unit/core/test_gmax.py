"""JITServe GMAX: margin-goodput priority with δ aging, cutoff + sliding-window grouping, online
cutoff tuning, frame-only cost-checked preemption, max_queue_ms drops, and the App. D.1/D.2
constructions (power-of-K replicas: tests/unit/router/test_policy_jit.py)."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.perf_model import constant_model
from scheduler.core.policies._cutoff_tuner import CutoffTuner
from scheduler.core.policies.gmax import GmaxParams, GmaxPolicy, best_window
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON
from scheduler.core.sim import SimRequest
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView, StepPlan
from tests.unit.core.policy_cases import (
    TAU,
    best_effort_finishes,
    d1_run,
    deadline_request,
    engine_views,
    latency_burst,
    policy_view,
    preempts_only_every,
    run_single_slot,
    small_gpu,
    stage_behind_its_sub_deadline,
    with_weight,
)

DL = SloClass.DEADLINE
_view = partial(policy_view, step=1)  # off a frame boundary (step 0) unless a test says so


# -- App. D.1 --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [4, 9])
@pytest.mark.parametrize("b_slack", [1.0, 1.5])
def test_d1_gmax_serves_the_valuable_request(n, b_slack):
    goodput, a_served = d1_run(GmaxPolicy(perf_model=constant_model(TAU)), n, b_slack)
    assert goodput == pytest.approx(10.0 * n * (n + 2)) and a_served


# -- App. D.2: the 1 + δ preemption threshold ------------------------------------------------


def _swap_case(waiting_weight: float):
    running = deadline_request("cur", out=50, weight=1.0, generated=10, first_token_time=0.1)
    newcomer = deadline_request("new", out=40, weight=waiting_weight, arrival=1.0)
    return [newcomer], [running]


def test_preemption_needs_the_d2_margin_and_a_frame_boundary():
    pol = GmaxPolicy(GmaxParams(preempt_margin=0.5, frame_steps=50, aging_delta=0.0, tune_cutoff=False))
    w, r = _swap_case(waiting_weight=1.2)  # better, but not by 1 + δ
    assert pol.plan(_view(w, r, cap=1, step=100, now=1.0)).preempt == []
    w, r = _swap_case(waiting_weight=20.0)
    assert pol.plan(_view(w, r, cap=1, step=100, now=1.0)).preempt == ["cur"]
    assert pol.plan(_view(w, r, cap=1, step=101, now=1.0)).preempt == []


def test_preemption_is_refused_when_the_stall_costs_more():
    running = deadline_request("cur", prompt=2_000_000, out=50, generated=10, first_token_time=0.1)
    newcomer = deadline_request("new", out=40, weight=2.0, arrival=1.0)
    pol = GmaxPolicy(GmaxParams(tune_cutoff=False))
    assert pol.plan(_view([newcomer], [running], cap=1, step=100, now=1.0)).preempt == []


@settings(max_examples=60, deadline=None)
@given(view=engine_views(), frame=st.integers(2, 80))
def test_never_preempts_off_frame(view, frame):
    assert preempts_only_every(GmaxPolicy(GmaxParams(frame_steps=frame)), view, frame)


# -- priority --------------------------------------------------------------------------------


def test_unachievable_deadline_has_no_goodput_left():
    ok = deadline_request("ok", deadline_ms=60_000, out=100)
    hopeless = deadline_request("hopeless", deadline_ms=10, out=100)
    p = GmaxPolicy(GmaxParams(aging_delta=0.0)).priorities(_view([ok, hopeless]))
    assert p[0] > 0 and p[1] == 0


def test_a_stage_behind_its_sub_deadline_keeps_its_value_while_the_program_can_finish():
    view = _view([stage_behind_its_sub_deadline(), deadline_request("other", deadline_ms=60_000, out=100)])
    by_program = GmaxPolicy(GmaxParams(aging_delta=0.0)).priorities(view)
    assert by_program[0] > 0
    by_stage = GmaxPolicy(GmaxParams(aging_delta=0.0, stage_deadlines=True)).priorities(view)
    assert by_stage[0] == 0 and by_stage[1] == by_program[1]  # JITServe's literal gate gives it up


def test_latency_goodput_counts_only_tokens_that_can_be_on_time():
    # One decode iteration ~8 ms; a 5 ms TPOT cannot be kept, so only the early tokens count.
    perf = small_gpu()

    def lat(rid, tpot):
        slo = SloSpec(ttft_ms=500, tpot_ms=tpot, slo_class=SloClass.LATENCY)
        return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=100, predicted_output_len=200)

    pol = GmaxPolicy(GmaxParams(aging_delta=0.0, objective="tokens"), perf_model=perf)
    p = pol.priorities(_view([lat("easy", 100), lat("hard", 5)]))
    assert p[0] > p[1] > 0


@settings(max_examples=60, deadline=None)
@given(view=engine_views(), factor=st.floats(1.0, 50.0), pick=st.integers(0, 100))
def test_higher_weight_never_lowers_priority(view, factor, pick):
    reqs = [*view.waiting, *view.running]
    if not reqs:
        return
    target = reqs[pick % len(reqs)]
    i = [r.rid for r in reqs].index(target.rid)
    pol = GmaxPolicy(GmaxParams(tune_cutoff=False, enforce_max_queue=False))
    assert pol.priorities(with_weight(view, target.rid, factor))[i] >= pol.priorities(view)[i] * (1 - 1e-12)


@settings(max_examples=40, deadline=None)
@given(wait_a=st.floats(0.0, 100.0), extra=st.floats(0.001, 100.0))
def test_aging_raises_best_effort_priority(wait_a, extra):
    older = RequestView(rid="old", slo=SloSpec(), arrival=-(wait_a + extra), prompt_len=10)
    newer = RequestView(rid="new", slo=SloSpec(), arrival=-wait_a, prompt_len=10)
    p = GmaxPolicy(GmaxParams(aging_delta=1.0)).priorities(_view([older, newer]))
    assert p[0] > p[1]


def test_aging_prevents_starvation_of_best_effort():
    """Heavier deadline requests arrive faster than two slots serve them; without aging the
    best-effort request never runs, with δ aging it does."""
    finished = {}
    for delta in (0.0, 50.0):
        pol = GmaxPolicy(GmaxParams(aging_delta=delta, tune_cutoff=False), perf_model=constant_model(TAU))
        finished[delta] = best_effort_finishes(pol, deadline_weight=5.0)
    assert finished == {0.0: False, 50.0: True}


# -- grouping --------------------------------------------------------------------------------


def test_best_window_filters_by_cutoff_then_groups_similar_lengths():
    #              a      b       c      d      e
    prio = np.array([10.0, 9.9, 9.8, 9.8, 1.0])
    length = np.array([100.0, 5000.0, 110.0, 120.0, 105.0])
    # B = 2: the 2nd best is 9.9, p = 0.95 keeps >= 9.405 (drops e). Sorted by length the
    # windows are (a,c)=19.8, (c,d)=19.6, (d,b)=19.7: the batch is (a,c), not the top pair (a,b).
    assert set(best_window(prio, length, 2, 0.95).tolist()) == {0, 2}
    # p = 1 keeps only the top B, so the group is exactly them, lengths notwithstanding.
    assert set(best_window(prio, length, 2, 1.0).tolist()) == {0, 1}
    # A low cutoff lets e in between a and c, splitting them: the dilution the paper warns of,
    # and the window (d,b) = 19.7 wins.
    assert set(best_window(prio, length, 2, 0.05).tolist()) == {1, 3}
    assert best_window(prio, length, 0, 0.9).size == 0
    assert set(best_window(prio[:2], length[:2], 5, 0.9).tolist()) == {0, 1}


def test_order_puts_the_chosen_group_first():
    reqs = [
        deadline_request(f"r{i}", prompt=p, out=200, weight=w)
        for i, (p, w) in enumerate([(100, 1.0), (4000, 1.0), (110, 1.0), (120, 1.0), (3000, 0.2)])
    ]
    pol = GmaxPolicy(GmaxParams(cutoff=0.5, tune_cutoff=False, aging_delta=0.0))
    view = _view(reqs, cap=2)
    prio = pol.priorities(view)
    group = best_window(prio, np.array([r.prompt_len for r in reqs], dtype=float), 2, 0.5)
    order = pol.plan(view).order
    assert set(order[:2]) == {reqs[i].rid for i in group}
    rest = [r for r in order[2:]]
    assert rest == sorted(rest, key=lambda rid: -prio[int(rid[1:])])


# -- admission drop --------------------------------------------------------------------------


def test_max_queue_drops_and_removes_from_order():
    slo = SloSpec(deadline_ms=10_000, slo_class=DL, max_queue_ms=100)
    stale = RequestView(rid="stale", slo=slo, arrival=0.0, prompt_len=10)
    fresh = RequestView(rid="fresh", slo=slo, arrival=0.95, prompt_len=10)
    plan = GmaxPolicy().plan(_view([stale, fresh], now=1.0))
    assert plan.drop == {"stale": QUEUE_TIMEOUT_REASON}
    assert plan.order == ["fresh"]
    assert GmaxPolicy(GmaxParams(enforce_max_queue=False)).plan(_view([stale, fresh], now=1.0)).drop == {}


# -- online cutoff tuning --------------------------------------------------------------------


def test_cutoff_tuner_climbs_towards_the_better_cutoff():
    grid = [0.5, 0.7, 0.9, 1.0]
    tuner = CutoffTuner(grid, start=1.0, epoch_steps=10)
    reward_of = {0.5: 1.0, 0.7: 5.0, 0.9: 3.0, 1.0: 2.0}
    t = 0.0
    tuner.step(0, t)
    for k in range(1, 80):
        tuner.reward(reward_of[tuner.current] * 10)
        t += 1.0
        tuner.step(k * 10, t)
    assert tuner.grid[tuner.best] == 0.7


@pytest.mark.parametrize(("deadline_ms", "rewarded"), [(60_000, True), (1_500, False)])
def test_gmax_tuner_credits_requests_that_left_before_their_deadline(deadline_ms, rewarded):
    pol = GmaxPolicy(GmaxParams(frame_steps=1, tune_epoch_frames=1))
    r = deadline_request("r", deadline_ms=deadline_ms, generated=5, first_token_time=0.1)
    pol.plan(_view([], [r], step=1, now=1.0))
    pol.plan(_view([], [], step=2, now=2.0))  # r left both queues: it finished at about t = 2
    assert (pol.tuner.scores[pol.tuner.best] > 0) is rewarded


# -- request-level objective (the default; JITServe §6: request goodput) ------------------------------------


def test_request_objective_prefers_the_cheaper_request_that_tokens_rank_second():
    # A long prompt is many tokens for little generation time: token goodput ranks it first,
    # request goodput (one met SLO each) the request that frees the card sooner.
    heavy = deadline_request("heavy", prompt=4000, out=100)
    light = deadline_request("light", prompt=10, out=20)
    view = _view([heavy, light])
    by_tokens = GmaxPolicy(GmaxParams(aging_delta=0.0, objective="tokens"), perf_model=small_gpu()).priorities(view)
    by_requests = GmaxPolicy(GmaxParams(aging_delta=0.0), perf_model=small_gpu()).priorities(view)
    assert by_tokens[0] > by_tokens[1]
    assert by_requests[1] > by_requests[0]


def test_request_objective_gives_a_latency_request_with_a_late_token_no_goodput():
    perf = small_gpu()  # ~8 ms per decode iteration: a 5 ms TPOT loses its later tokens

    def lat(rid, tpot):
        slo = SloSpec(ttft_ms=500, tpot_ms=tpot, slo_class=SloClass.LATENCY)
        return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=100, predicted_output_len=200)

    pol = GmaxPolicy(GmaxParams(aging_delta=0.0, objective="requests"), perf_model=perf)
    p = pol.priorities(_view([lat("easy", 100), lat("hard", 5)]))
    assert p[0] > 0 and p[1] == 0  # token mode gives "hard" its early on-time tokens


def test_unknown_objective_names_the_field():
    with pytest.raises(ValueError, match="objective"):
        GmaxParams(objective="bogus")


# -- latency urgency (our addition: a latency request's window closes within seconds) ----------


def _latency_and_deadline_twins() -> list[SimRequest]:
    """Equal work and value, arriving together with the deadline request queued first: served
    second, the latency request misses its 3-iteration TTFT; the deadline request keeps."""
    latency = SloSpec(ttft_ms=3 * TAU * 1000, tpot_ms=2 * TAU * 1000, slo_class=SloClass.LATENCY)
    deadline = SloSpec(deadline_ms=100 * TAU * 1000, slo_class=DL)
    return [SimRequest("dl", deadline, 0.0, 8, 4, 4, 4), SimRequest("lat", latency, 0.0, 8, 4, 4, 4)]


@pytest.mark.parametrize("urgency, both_met", [(0.0, False), (GmaxParams().latency_urgency, True), (0.5, True)])
def test_latency_urgency_serves_the_request_that_cannot_wait_first(urgency, both_met):
    pol = GmaxPolicy(GmaxParams(aging_delta=0.0, tune_cutoff=False, latency_urgency=urgency, ttft_urgency=0.0))
    outcomes = run_single_slot(pol, _latency_and_deadline_twins()).outcomes()
    assert outcomes["dl"].attained
    assert outcomes["lat"].attained is both_met


def test_latency_urgency_scales_a_reachable_latency_requests_value_only():
    perf = small_gpu()  # ~8 ms per decode iteration

    def lat(rid: str, ttft_ms: float) -> RequestView:
        slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=100, slo_class=SloClass.LATENCY)
        return RequestView(rid=rid, slo=slo, arrival=0.0, prompt_len=100, predicted_output_len=200)

    view = _view([lat("reachable", 500), lat("too-late", 1), deadline_request("dl", prompt=100, out=200)])
    plain = GmaxPolicy(GmaxParams(aging_delta=0.0, latency_urgency=0.0, ttft_urgency=0.0), perf_model=perf)
    urgent = GmaxPolicy(GmaxParams(aging_delta=0.0, latency_urgency=0.5, ttft_urgency=0.0), perf_model=perf)
    plain, urgent = plain.priorities(view), urgent.priorities(view)
    assert urgent[0] == pytest.approx(1.5 * plain[0]) and plain[0] > 0
    assert urgent[1] == plain[1] == 0.0  # a request that cannot make it gains nothing
    assert urgent[2] == pytest.approx(plain[2])


def test_negative_latency_urgency_names_the_field():
    with pytest.raises(ValueError, match="latency_urgency"):
        GmaxParams(latency_urgency=-0.1)
    with pytest.raises(ValueError, match="ttft_urgency"):
        GmaxParams(ttft_urgency=-1.0)


def _ttft_urgency_ratio(now: float, generated: int = 0) -> float:
    """A reachable latency request's priority with ttft_urgency 2 over its priority without."""
    slo = SloSpec(ttft_ms=2_000, tpot_ms=100, slo_class=SloClass.LATENCY)
    req = RequestView(rid="lat", slo=slo, arrival=0.0, prompt_len=100, predicted_output_len=200, generated=generated)
    view = _view([req], now=now) if generated == 0 else _view([], [req], now=now)
    params = {"aging_delta": 0.0, "latency_urgency": 0.0}
    plain = GmaxPolicy(GmaxParams(**params, ttft_urgency=0.0), perf_model=small_gpu()).priorities(view)
    urgent = GmaxPolicy(GmaxParams(**params, ttft_urgency=2.0), perf_model=small_gpu()).priorities(view)
    assert plain[0] > 0
    return float(urgent[0] / plain[0])


def test_ttft_urgency_grows_as_a_waiting_requests_window_closes():
    early, late = _ttft_urgency_ratio(0.0), _ttft_urgency_ratio(1.5)
    assert 1.0 < early < late <= 3.0  # 1 + 2 x the share of the window gone, at most all of it
    assert _ttft_urgency_ratio(1.5, generated=5) == pytest.approx(1.0)  # its first token is out


@pytest.mark.parametrize("ttft_urgency, latency_met", [(0.0, False), (GmaxParams().ttft_urgency, True)])
def test_ttft_urgency_starts_the_request_whose_window_closes_before_cheaper_work(ttft_urgency, latency_met):
    # The deadline request is cheaper (half the work), so value per second serves it first and
    # the latency request, second, misses its 3-iteration TTFT; urgency serves it in its window.
    latency = SloSpec(ttft_ms=3 * TAU * 1000, tpot_ms=2 * TAU * 1000, slo_class=SloClass.LATENCY)
    deadline = SloSpec(deadline_ms=100 * TAU * 1000, slo_class=DL)
    reqs = [SimRequest("dl", deadline, 0.0, 8, 3, 3, 3), SimRequest("lat", latency, 0.0, 8, 6, 6, 6)]
    pol = GmaxPolicy(GmaxParams(aging_delta=0.0, tune_cutoff=False, latency_urgency=0.0, ttft_urgency=ttft_urgency))
    outcomes = run_single_slot(pol, reqs).outcomes()
    assert outcomes["dl"].attained
    assert outcomes["lat"].attained is latency_met


# -- lost causes (an SLO request with no goodput left runs in the best-effort tier) -----------


def _lost_and_reachable(now: float = 1.0) -> EngineView:
    """Two waiting latency requests at `now`: one whose 500 ms TTFT has passed, one just in."""
    slo = SloSpec(ttft_ms=500, tpot_ms=100, slo_class=SloClass.LATENCY)
    lost = RequestView(rid="lost", slo=slo, arrival=0.0, prompt_len=100, predicted_output_len=20)
    fresh = RequestView(rid="fresh", slo=slo, arrival=now, prompt_len=100, predicted_output_len=400)
    return _view([lost, fresh], now=now)


def test_a_request_that_can_no_longer_meet_its_slo_runs_in_the_tier_after_the_rest():
    view = _lost_and_reachable()
    plan = GmaxPolicy(GmaxParams(tune_cutoff=False), perf_model=small_gpu()).plan(view)
    assert plan.best_effort == {"lost"}
    assert list(plan.order) == ["fresh", "lost"]
    assert plan.order_at is not None and plan.best_effort_at.tolist() == [0]  # its queue position


def test_without_defer_lost_a_lost_request_keeps_its_aged_rank_outside_the_tier():
    view = _lost_and_reachable(now=30.0)  # aged 30 s: its aging outweighs the fresh request's value
    plan = GmaxPolicy(GmaxParams(tune_cutoff=False, defer_lost=False), perf_model=small_gpu()).plan(view)
    assert not plan.best_effort
    assert list(plan.order)[0] == "lost"
    deferred = GmaxPolicy(GmaxParams(tune_cutoff=False), perf_model=small_gpu()).plan(view)
    assert list(deferred.order) == ["fresh", "lost"]


def _burst_plan(defer_backlogged: bool, ttfts_ms: tuple[float, float, float]) -> StepPlan:
    params = GmaxParams(
        tune_cutoff=False, ttft_urgency=0.0, latency_urgency=0.0, aging_delta=0.0, defer_backlogged=defer_backlogged
    )
    return GmaxPolicy(params, perf_model=small_gpu()).plan(latency_burst(ttfts_ms))


def test_a_first_token_the_prefills_ahead_make_late_runs_in_the_tier_so_the_next_one_makes_its():
    # (latency_burst's prefills: B's TTFT fits alone but not behind A; C's fits behind A alone,
    # not behind A and B.)
    ttfts = (400.0, 140.0, 200.0)
    plain = _burst_plan(False, ttfts)
    assert not plain.best_effort and list(plain.order) == ["A", "B", "C"]
    deferred = _burst_plan(True, ttfts)
    assert set(deferred.best_effort) == {"B"}
    assert list(deferred.order) == ["A", "C", "B"]


def test_the_backlog_defers_nothing_that_makes_its_first_token_in_order():
    assert not _burst_plan(True, (400.0, 400.0, 400.0)).best_effort


def _newcomer_beside(others: list[RequestView]) -> StepPlan:
    """A newcomer whose 15 ms TPOT a small GPU keeps alone (an 8 ms step) but not beside 200
    more decodes, planned with `others` waiting."""
    slo = SloSpec(ttft_ms=500, tpot_ms=15, slo_class=SloClass.LATENCY)
    fresh = RequestView(rid="fresh", slo=slo, arrival=10.0, prompt_len=100, predicted_output_len=50)
    view = policy_view([*others, fresh], cap=256, step=1, now=10.0, free_kv=2 * 10**6)  # no KV in use
    params = GmaxParams(tune_cutoff=False, defer_backlogged=False)  # its value alone, not the queue ahead
    return GmaxPolicy(params, perf_model=small_gpu()).plan(view)


def test_the_tiers_lost_requests_do_not_price_a_newcomer_out_of_its_tpot():
    # Lost and in the tier, the plan path keeps them out of the SLO work's batch (held while
    # waiting, retracted where they take its room): the newcomer is valued at its own batch.
    lost_slo = SloSpec(ttft_ms=100, tpot_ms=15, slo_class=SloClass.LATENCY)
    lost = [
        RequestView(rid=f"lost{i}", slo=lost_slo, arrival=0.0, prompt_len=100, best_effort_tier=True)
        for i in range(200)
    ]
    plan = _newcomer_beside(lost)
    assert "fresh" not in plan.best_effort
    # Best-effort jobs do run beside it: behind 200 of them its TPOT is out of reach.
    jobs = [RequestView(rid=f"job{i}", slo=SloSpec(), arrival=0.0, prompt_len=100) for i in range(200)]
    assert "fresh" in _newcomer_beside(jobs).best_effort


# -- best effort (no SLO: no goodput of its own, δ's aging keeps it from starving) -----------


def _short_best_effort_and_latency() -> list[SimRequest]:
    """A short best-effort request queued first and a latency request with a 3-iteration TTFT:
    served second, the latency request misses it; the best-effort request has no SLO to miss."""
    latency = SloSpec(ttft_ms=3 * TAU * 1000, tpot_ms=2 * TAU * 1000, slo_class=SloClass.LATENCY)
    return [SimRequest("be", SloSpec(), 0.0, 8, 4, 4, 4), SimRequest("lat", latency, 0.0, 8, 8, 8, 8)]


@pytest.mark.parametrize("value, latency_met", [(GmaxParams().best_effort_value, True), (1.0, False)])
def test_best_effort_runs_on_what_the_slo_work_leaves(value, latency_met):
    pol = GmaxPolicy(GmaxParams(tune_cutoff=False, best_effort_value=value, ttft_urgency=0.0))
    result = run_single_slot(pol, _short_best_effort_and_latency())
    assert result.outcomes()["lat"].attained is latency_met
    assert result.records["be"].finished  # later, not never


def test_best_effort_has_no_goodput_until_it_waits():
    be = RequestView(rid="be", slo=SloSpec(), arrival=0.0, prompt_len=10, predicted_output_len=10)
    dl = deadline_request("dl", prompt=10_000, out=1_000)
    p = GmaxPolicy(GmaxParams(aging_delta=0.0)).priorities(_view([be, dl]))
    assert p[0] == 0.0 < p[1]  # a hundredfold cheaper, and still behind SLO work that can finish
    valued = GmaxPolicy(GmaxParams(aging_delta=0.0, best_effort_value=1.0)).priorities(_view([be, dl]))
    assert valued[0] > valued[1]


def test_negative_best_effort_value_names_the_field():
    with pytest.raises(ValueError, match="best_effort_value"):
        GmaxParams(best_effort_value=-1.0)
