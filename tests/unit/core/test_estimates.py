"""The estimates' scalar and vector forms agree: deadlines, DSLO due times, output-length
bounds, Eq. 1 and the degradation f, one request at a time and as numpy columns."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.estimates import (
    DEFAULT_OUTPUT_LEN,
    GainWeights,
    absolute_deadline,
    absolute_deadlines,
    answer_due,
    base_gain,
    deadline_base,
    deadline_bases,
    deadline_seconds,
    degradation,
    degradations,
    next_deadline,
    next_token_due,
    output_bound,
    output_bounds,
    predicted_totals,
    request_deadline,
    swaps_that_pay,
    token_due,
    token_dues,
)
from scheduler.core.req_arrays import ReqArrays
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import RequestView


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _same(scalar: float | None, vector: float) -> bool:
    return math.isnan(vector) if scalar is None else scalar == vector


times = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
maybe_time = st.none() | times
maybe_span = st.none() | st.floats(min_value=1e-3, max_value=1e4, allow_nan=False)
maybe_len = st.none() | st.integers(min_value=0, max_value=10_000)
finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False)
alphas = st.floats(min_value=0.0, max_value=20.0) | st.just(math.inf)


@given(st.lists(st.tuples(maybe_span, times, maybe_time, maybe_time), min_size=1, max_size=20))
def test_absolute_deadline_scalar_and_vector_agree(rows):
    deadline_s, arrival, program_arrival, stage = (np.array([_nan(r[i]) for r in rows]) for i in range(4))
    vector = absolute_deadlines(deadline_s, arrival, program_arrival, stage)
    bases = deadline_bases(arrival, program_arrival)
    for i, (d, a, p, s) in enumerate(rows):
        assert _same(absolute_deadline(d, a, p, s), vector[i])
        assert deadline_base(a, p) == bases[i]


SLOS = st.sampled_from(
    [
        SloSpec(ttft_ms=200, tpot_ms=50, slo_class=SloClass.LATENCY),
        SloSpec(ttft_ms=300, slo_class=SloClass.LATENCY),
        SloSpec(deadline_ms=2000, slo_class=SloClass.DEADLINE),
        SloSpec(ttft_ms=100, deadline_ms=3000, slo_class=SloClass.DEADLINE),
        SloSpec(deadline_ms=9000, slo_class=SloClass.COMPOUND, program_id="p", stage=1),
        SloSpec(deadline_ms=9000, slo_class=SloClass.COMPOUND, program_id="q", stage=0),
        SloSpec(),
    ]
)


@st.composite
def views(draw):
    slo = draw(SLOS)
    arrival = draw(times)
    compound = slo.slo_class is SloClass.COMPOUND
    return RequestView(
        rid=f"r{draw(st.integers(0, 10**9))}",
        slo=slo,
        arrival=arrival,
        prompt_len=draw(st.integers(1, 4000)),
        generated=draw(st.integers(0, 3000)),
        max_new_tokens=draw(maybe_len),
        predicted_output_len=draw(st.none() | st.floats(min_value=0.0, max_value=1e4, allow_nan=False)),
        program_arrival=draw(st.none() | st.floats(0.0, arrival)) if compound else None,
        stage_deadline=draw(maybe_time) if compound else None,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(views(), min_size=1, max_size=12), st.integers(0, 12), st.sampled_from([64, DEFAULT_OUTPUT_LEN]))
def test_request_arrays_hold_each_views_scalar_estimates(reqs, split, default):
    split = min(split, len(reqs))
    a = ReqArrays.from_views(reqs[:split], reqs[split:], default)
    for i, r in enumerate(reqs):
        assert _same(request_deadline(r), a.deadline[i])
        if r.slo.deadline_ms is not None:
            assert a.base[i] == deadline_base(r.arrival, r.program_arrival)
        bound = output_bound(r.predicted_output_len, r.max_new_tokens, r.generated, default)
        assert a.total_out[i] == bound
    dues = token_dues(a.arrival, a.ttft_s, a.tpot_s, a.generated)
    for i, r in enumerate(reqs):
        due = next_token_due(r)
        assert due == token_due(r.slo, r.arrival, r.generated)
        assert _same(due, dues[i]) or dues[i] == pytest.approx(due, rel=1e-12, abs=1e-9)
    np.testing.assert_array_equal(predicted_totals(reqs, a.generated, default), a.total_out)


@given(maybe_len, maybe_len, st.integers(0, 10_000), st.integers(1, 4096))
def test_output_bound_scalar_and_vector_agree(predicted, cap, generated, default):
    vector = output_bounds(np.array([_nan(predicted)]), np.array([_nan(cap)]), np.array([float(generated)]), default)
    scalar = output_bound(predicted, cap, generated, default)
    assert scalar == vector[0]
    assert scalar >= generated + 1
    if cap is not None:
        assert scalar <= max(cap, generated + 1)


def test_output_bound_reads_prediction_then_cap_then_default():
    assert output_bound(40, 90) == 40
    assert output_bound(400, 90) == 90  # a prediction never passes the client's cap
    assert output_bound(None, 90) == 90
    assert output_bound(None, None) == DEFAULT_OUTPUT_LEN
    assert output_bound(40, 90, generated=50) == 51  # overrun: one more token to come


@settings(max_examples=300)
@given(st.lists(st.tuples(finite, finite), min_size=1, max_size=20), alphas)
def test_degradation_scalar_and_vector_agree(pairs, alpha):
    slo = np.array([p[0] for p in pairs])
    x = np.array([p[1] for p in pairs])
    vector = degradations(slo, x, alpha)
    for i, (s, xi) in enumerate(pairs):
        assert vector[i] == pytest.approx(degradation(s, xi, alpha), rel=1e-12, abs=1e-300)


def test_degradation_edges_and_bad_alpha():
    edges = [(1.0, 1.0), (1.0, 0.0), (0.0, 1.0), (-1.0, -0.5), (1.0, math.inf), (math.inf, 5.0)]
    for alpha in (0.0, 1.0, math.inf):
        vector = degradations(np.array([e[0] for e in edges]), np.array([e[1] for e in edges]), alpha)
        assert vector.tolist() == [degradation(s, x, alpha) for s, x in edges]
    for bad in (-1.0, math.nan):
        with pytest.raises(ValueError):
            degradation(1.0, 2.0, bad)
        with pytest.raises(ValueError):
            degradations(np.ones(1), np.ones(1), bad)


@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(0, 5000), st.floats(0.1, 5.0)), min_size=1, max_size=10))
def test_base_gain_is_elementwise(rows):
    weights = GainWeights(1.5, 3.0)
    prompt, out, weight = (np.array([r[i] for r in rows], dtype=float) for i in range(3))
    vector = base_gain(prompt, out, weight, weights)
    assert vector.tolist() == [base_gain(p, o, w, weights) for p, o, w in rows]


def test_next_deadline_follows_the_class():
    lat = RequestView("l", SloSpec(ttft_ms=200, tpot_ms=50, slo_class=SloClass.LATENCY), 10.0, 8, generated=4)
    dl = RequestView("d", SloSpec(deadline_ms=2000, slo_class=SloClass.DEADLINE), 10.0, 8)
    stage = RequestView(
        "c", SloSpec(deadline_ms=9000, slo_class=SloClass.COMPOUND, program_id="p"), 10.0, 8, program_arrival=7.0
    )
    assert next_deadline(lat) == pytest.approx(10.0 + 0.2 + 4 * 0.05)
    assert next_deadline(dl) == request_deadline(dl) == pytest.approx(12.0)
    assert next_deadline(stage) == pytest.approx(16.0)  # counted from the program's first arrival
    assert next_deadline(RequestView("b", SloSpec(), 10.0, 8)) is None


@given(SLOS, times, st.integers(1, 5000))
def test_answer_due_names_the_routers_latency_rule(slo, arrival, l_out):
    due = answer_due(slo, arrival, l_out)
    if slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND):
        assert due == absolute_deadline(deadline_seconds(slo), arrival)  # no program arrival at a router
    elif slo.slo_class is SloClass.LATENCY:
        assert due == token_due(slo, arrival, l_out)  # one TPOT past the last token's due time
        last = token_due(slo, arrival, l_out - 1)
        assert due - last == pytest.approx((slo.tpot_ms or 0.0) / 1000.0, abs=1e-6)
    else:
        assert due is None


def test_swaps_stop_at_the_first_pair_that_does_not_pay() -> None:
    gain_in = np.array([10.0, 8.0, 1.0, 9.0])
    gain_out = np.array([1.0, 2.0, 0.9, 1.0])
    stalls = np.array([0.01, 0.01, 0.01, 0.01])
    # the third pair gains 0.1 over its victim, less than the margin: it and every pair after stop
    assert swaps_that_pay(gain_in, gain_out, 1.0, stalls, 5.0, 0.2) == 2
    # a stall the gain over the horizon does not cover stops the first pair
    assert swaps_that_pay(gain_in, gain_out, 1.0, np.full(4, 10.0), 5.0, 0.2) == 0
    # no batch gain to lose: only the margin decides
    assert swaps_that_pay(gain_in[:2], gain_out[:2], 1.0, stalls[:2], 0.0, 0.2) == 2
    # a further condition per pair (tempo: the fair-share priority must favour the swap too)
    assert swaps_that_pay(gain_in, gain_out, 1.0, stalls, 5.0, 0.2, np.array([True, False, True, True])) == 1
    assert swaps_that_pay(np.zeros(0), np.zeros(0), 1.0, np.zeros(0), 5.0, 0.2) == 0
