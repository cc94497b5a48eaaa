"""Service gain (Tempo Eqs. 1–3): degradation shape, α→∞ step, exact vs summary scoring."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.estimates import DEFAULT_WEIGHTS, GainWeights, base_gain, degradation, degradations
from scheduler.core.gain import outcome_gain
from scheduler.core.outcome import evaluate
from scheduler.core.slo import SloClass, SloSpec

pos = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)
alphas = st.floats(min_value=0.0, max_value=20.0)

LATENCY = SloSpec(ttft_ms=200, tpot_ms=50, slo_class=SloClass.LATENCY)
DEADLINE = SloSpec(deadline_ms=2000, slo_class=SloClass.DEADLINE)


@given(pos, pos, pos, alphas)
def test_degradation_monotone_in_x_and_bounded(slo, x1, x2, alpha):
    lo, hi = sorted((x1, x2))
    assert 0.0 <= degradation(slo, hi, alpha) <= degradation(slo, lo, alpha) <= 1.0


@given(pos, pos, alphas, alphas)
def test_larger_alpha_penalises_more(slo, x, a1, a2):
    lo, hi = sorted((a1, a2))
    assert degradation(slo, x, hi) <= degradation(slo, x, lo) + 1e-12


@given(pos, pos)
def test_alpha_infinity_is_the_step(slo, x):
    assert degradation(slo, x, math.inf) == (1.0 if x <= slo else 0.0)


def test_degradation_values():
    assert degradation(1.0, 0.5) == 1.0
    assert degradation(1.0, 2.0) == pytest.approx(0.5)
    assert degradation(1.0, 2.0, alpha=2) == pytest.approx(0.25)
    assert degradation(1.0, 2.0, alpha=0) == 1.0
    with pytest.raises(ValueError):
        degradation(1.0, 2.0, alpha=-1)


def test_base_gain_weights_and_request_weight():
    assert base_gain(100, 50) == 200.0  # 1:2 default
    assert base_gain(100, 50, weight=3.0) == 600.0
    assert base_gain(100, 50, weights=GainWeights(1.0, 1.0)) == 150.0


@given(
    ttlt=st.floats(min_value=0.1, max_value=10.0),
    alpha=st.one_of(alphas, st.just(math.inf)),
    weight=st.floats(min_value=0.1, max_value=5.0),
)
def test_deadline_request_is_eq2(ttlt, alpha, weight):
    slo = SloSpec(deadline_ms=2000, slo_class=SloClass.DEADLINE, weight=weight)
    times = [ttlt * (i + 1) / 10 for i in range(10)]
    out = evaluate(slo, 0.0, times, finish_time=ttlt)
    expected = base_gain(30, 10, weight) * degradation(2.0, ttlt, alpha)
    assert outcome_gain(out, 30, alpha=alpha) == pytest.approx(expected)
    if alpha == math.inf:
        assert outcome_gain(out, 30, alpha=alpha) == (base_gain(30, 10, weight) if out.attained else 0.0)


token_gaps = st.lists(st.floats(min_value=0.0, max_value=0.2), min_size=1, max_size=40)


@given(first=st.floats(min_value=0.01, max_value=1.0), gaps=token_gaps)
def test_latency_alpha_infinity_counts_on_time_tokens(first, gaps):
    times = [first]
    for g in gaps[1:]:
        times.append(times[-1] + g)
    out = evaluate(LATENCY, 0.0, times, finish_time=times[-1])
    step = DEFAULT_WEIGHTS.w_in * 64 * bool(out.ttft_ok) + DEFAULT_WEIGHTS.w_out * out.on_time_tokens
    assert outcome_gain(out, 64, alpha=math.inf) == pytest.approx(step)
    assert outcome_gain(out, 64, alpha=math.inf, token_times=times, arrival=0.0) == pytest.approx(step)


@given(first=st.floats(min_value=0.01, max_value=1.0), gaps=token_gaps, alpha=alphas)
def test_summary_gain_is_a_lower_bound_of_exact(first, gaps, alpha):
    times = [first]
    for g in gaps[1:]:
        times.append(times[-1] + g)
    out = evaluate(LATENCY, 0.0, times, finish_time=times[-1])
    exact = outcome_gain(out, 64, alpha=alpha, token_times=times, arrival=0.0)
    summary = outcome_gain(out, 64, alpha=alpha)
    assert summary <= exact + 1e-9
    assert exact <= base_gain(64, len(times)) + 1e-9
    if out.attained:
        assert exact == pytest.approx(base_gain(64, len(times)))


def test_latency_exact_per_token_values():
    # token 0 due 0.2 s (on time at 0.1); token 1 due 0.25 s, emitted 0.5 s -> f = 0.5
    out = evaluate(LATENCY, 10.0, [10.1, 10.5], finish_time=10.5)
    gain = outcome_gain(out, 10, alpha=1.0, token_times=[10.1, 10.5], arrival=10.0)
    assert gain == pytest.approx(10 * 1 + 2 * (1 + 0.5))


def test_dropped_request_earns_nothing():
    out = evaluate(DEADLINE, 0.0, [0.1], finish_time=0.2, finished=False)
    assert outcome_gain(out, 10) == 0.0


def test_missed_deadline_without_visible_lateness_earns_nothing():
    # compound: deadline measured from the program's first arrival, earlier than this call's arrival
    slo = SloSpec(deadline_ms=1000, slo_class=SloClass.COMPOUND, program_id="p")
    out = evaluate(slo, 5.0, [5.5], finish_time=5.6, deadline_abs=5.2)
    assert out.deadline_ok is False
    assert outcome_gain(out, 10) == 0.0
    assert outcome_gain(out, 10, ttlt_s=2.0) == pytest.approx(base_gain(10, 1) * 0.5)


def test_best_effort_gets_full_gain_when_finished():
    out = evaluate(SloSpec(), 0.0, [1.0, 2.0], finish_time=2.0)
    assert outcome_gain(out, 5) == base_gain(5, 2)


@given(ttft=st.floats(min_value=0.01, max_value=2.0), tpot=st.floats(min_value=0.0, max_value=0.2), alpha=alphas)
def test_realised_gain_of_a_steady_stream_is_eq3(ttft, tpot, alpha):
    """Eq. 3 written out with the estimates' vector degradation: prompt valued at f(TTFT), each
    token at f(its DSLO due time, its emission)."""
    n = 25
    times = [ttft + i * tpot for i in range(n)]
    out = evaluate(LATENCY, 0.0, times, finish_time=times[-1])
    due = (LATENCY.ttft_ms + np.arange(n) * LATENCY.tpot_ms) / 1000.0
    eq3 = DEFAULT_WEIGHTS.w_in * 40 * degradation(0.2, ttft, alpha)
    eq3 += DEFAULT_WEIGHTS.w_out * float(degradations(due, np.array(times), alpha).sum())
    realised = outcome_gain(out, 40, alpha=alpha, token_times=times, arrival=0.0)
    assert realised == pytest.approx(eq3, rel=1e-9, abs=1e-9)
