"""Goodput definitions: request, DSLO token, JITServe token (§3) and service-gain totals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.core.estimates import base_gain
from scheduler.core.goodput import (
    attainment,
    dslo_token_goodput,
    jitserve_token_goodput,
    request_goodput,
    service_gain_potential,
    service_gain_total,
    summarize,
)
from scheduler.core.outcome import evaluate
from scheduler.core.slo import SloClass, SloSpec

LAT = SloSpec(ttft_ms=100, tpot_ms=100, slo_class=SloClass.LATENCY)
DL = SloSpec(deadline_ms=1000, slo_class=SloClass.DEADLINE)
BE = SloSpec()


def comp(pid: str) -> SloSpec:
    return SloSpec(deadline_ms=1000, slo_class=SloClass.COMPOUND, program_id=pid)


def latency_outcome(times):
    return evaluate(LAT, 0.0, times, finish_time=times[-1])


def test_request_goodput_and_attainment():
    good = latency_outcome([0.05, 0.15, 0.25])  # all on time
    late = latency_outcome([0.05, 0.5])  # token 1 due 0.2
    dl_ok = evaluate(DL, 0.0, [0.5], finish_time=0.9)
    dl_miss = evaluate(DL, 0.0, [0.5], finish_time=1.1)
    be = evaluate(BE, 0.0, [3.0], finish_time=3.0)
    outs = [good, late, dl_ok, dl_miss, be]
    assert request_goodput(outs) == 3
    assert request_goodput(outs, include_best_effort=False) == 2
    assert attainment(outs) == pytest.approx(0.5)
    assert attainment([]) == 1.0


def test_dslo_token_goodput_counts_tokens_by_due_time():
    late = latency_outcome([0.05, 0.5, 0.55])  # token 2 due 0.3: late too -> 1 on time
    dropped = evaluate(LAT, 0.0, [0.05, 0.1], finish_time=0.2, finished=False)  # delivered on time
    dl_ok = evaluate(DL, 0.0, [0.1, 0.2], finish_time=0.9)
    dl_miss = evaluate(DL, 0.0, [0.1, 0.2], finish_time=1.5)
    be = evaluate(BE, 0.0, [0.1], finish_time=0.1)
    assert dslo_token_goodput([late, dropped, dl_ok, dl_miss, be]) == 1 + 2 + 2
    assert dslo_token_goodput([be], include_best_effort=True) == 1


def test_jitserve_token_goodput_per_class():
    lat = latency_outcome([0.05, 0.5, 0.55])  # 1 on-time token
    dl_ok = evaluate(DL, 0.0, [0.1, 0.2], finish_time=0.9)  # 10 in + 2 out
    dl_miss = evaluate(DL, 0.0, [0.1, 0.2], finish_time=1.5)
    outs = [lat, dl_ok, dl_miss]
    assert jitserve_token_goodput(outs, [7, 10, 20]) == 1 + 12


def test_jitserve_compound_program_is_all_or_nothing():
    a1 = evaluate(comp("a"), 0.0, [0.1], finish_time=0.2, deadline_abs=1.0)
    a2 = evaluate(comp("a"), 0.3, [0.5, 0.6], finish_time=0.9, deadline_abs=1.0)
    b1 = evaluate(comp("b"), 0.0, [0.1], finish_time=0.2, deadline_abs=1.0)
    b2 = evaluate(comp("b"), 0.3, [0.5, 1.2], finish_time=1.2, deadline_abs=1.0)  # final call late
    assert jitserve_token_goodput([a1, a2, b1, b2], [5, 6, 5, 6]) == (5 + 1) + (6 + 2)


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError):
        jitserve_token_goodput([latency_outcome([0.05])], [])
    with pytest.raises(ValueError):
        service_gain_total([latency_outcome([0.05])], [1, 2])


@given(
    ends=st.lists(st.floats(min_value=0.1, max_value=3.0), min_size=1, max_size=20),
    alpha=st.floats(min_value=0.0, max_value=10.0),
)
def test_service_gain_bounds_and_alpha_infinity_is_request_goodput(ends, alpha):
    outs = [evaluate(DL, 0.0, [e / 2, e], finish_time=e) for e in ends]
    prompts = [10] * len(outs)
    potential = service_gain_potential(outs, prompts)
    assert potential == pytest.approx(base_gain(10, 2) * len(outs))
    gain = service_gain_total(outs, prompts, alpha=alpha)
    step = service_gain_total(outs, prompts, alpha=math.inf)
    assert step - 1e-9 <= gain <= potential + 1e-9
    assert step == pytest.approx(base_gain(10, 2) * request_goodput(outs))


def test_summarize_agrees_with_the_parts():
    outs = [
        latency_outcome([0.05, 0.15]),
        evaluate(DL, 0.0, [0.5], finish_time=1.5),
        evaluate(BE, 0.0, [1.0], finish_time=1.0),
    ]
    prompts = [4, 8, 2]
    s = summarize(outs, prompts, alpha=1.0, duration_s=2.0)
    assert s.requests == 3
    assert s.attained == 1
    assert s.attainment == pytest.approx(0.5)
    assert s.dslo_tokens == dslo_token_goodput(outs)
    assert s.jitserve_tokens == jitserve_token_goodput(outs, prompts)
    assert s.service_gain == pytest.approx(service_gain_total(outs, prompts))
    assert s.per_second(s.attained) == pytest.approx(0.5)
    assert s.service_gain < s.service_gain_potential
