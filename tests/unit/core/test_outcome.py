"""evaluate(): deadline-based TPOT (early tokens bank slack), TTFT, end-to-end deadlines
(including a program's absolute deadline), dropped requests, and the report dict."""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from scheduler.core.outcome import evaluate
from scheduler.core.slo import SloClass, SloSpec

FAST = settings(max_examples=80, deadline=None)

LAT = SloSpec(ttft_ms=100.0, tpot_ms=10.0, slo_class=SloClass.LATENCY)  # token i due 0.1 + 0.01 i
ARRIVAL = 1000.0


def test_all_on_time():
    times = [ARRIVAL + 0.05, ARRIVAL + 0.105, ARRIVAL + 0.12]  # due 0.10, 0.11, 0.12
    o = evaluate(LAT, ARRIVAL, times, finish_time=times[-1])
    assert o.ttft_s == pytest.approx(0.05)
    assert o.ttft_ok is True and o.tpot_ok is True and o.deadline_ok is None
    assert o.on_time_tokens == 3 and o.output_tokens == 3
    assert o.worst_lateness_s == pytest.approx(0.0, abs=1e-9)  # the last token lands exactly on its due time
    assert o.attained


def test_early_tokens_bank_slack_for_a_long_gap():
    # The first token comes at 10 ms; then a 90 ms stall before token 1 (gap >> tpot), but token 1
    # is still due at 110 ms, so the stall is absorbed by the slack banked by the early first token.
    times = [ARRIVAL + 0.010, ARRIVAL + 0.100, ARRIVAL + 0.101, ARRIVAL + 0.102]
    o = evaluate(LAT, ARRIVAL, times, finish_time=times[-1])
    assert o.tpot_ok is True and o.ttft_ok is True and o.attained
    assert o.on_time_tokens == 4
    # worst lateness is the least-negative slack: token 1 at 100 ms vs due 110 ms
    assert o.worst_lateness_s == pytest.approx(-0.010)


def test_one_late_token_fails_tpot_but_not_ttft():
    # Token 2 (due 120 ms) comes 5 ms late; every other token is within its due time.
    times = [ARRIVAL + 0.09, ARRIVAL + 0.105, ARRIVAL + 0.125, ARRIVAL + 0.128]
    o = evaluate(LAT, ARRIVAL, times, finish_time=times[-1])
    assert o.ttft_ok is True
    assert o.tpot_ok is False
    assert not o.attained
    assert o.on_time_tokens == 3  # tokens 0, 1, 3 (due 130 ms) are on time
    assert o.worst_lateness_s == pytest.approx(0.005)


def test_late_first_token_fails_ttft_only():
    # first token 5 ms late, later tokens exactly on their own due times (110, 120 ms)
    times = [ARRIVAL + 0.105, ARRIVAL + 0.11, ARRIVAL + 0.12]
    o = evaluate(LAT, ARRIVAL, times, finish_time=times[-1])
    assert o.ttft_ok is False
    assert o.tpot_ok is True  # tpot judges tokens after the first
    assert not o.attained
    assert o.on_time_tokens == 2
    assert o.worst_lateness_s == pytest.approx(0.005)


def test_constant_gap_slightly_above_tpot_eventually_misses():
    # Gaps of 11 ms against 10 ms tpot: starting 4.5 ms early, token i is (i - 4.5) ms late,
    # so tokens 0..4 are on time and 5..9 are late.
    times = [ARRIVAL + 0.0955 + 0.011 * i for i in range(10)]
    o = evaluate(LAT, ARRIVAL, times, finish_time=times[-1])
    assert o.ttft_ok is True
    assert o.tpot_ok is False
    assert o.on_time_tokens == 5
    assert o.worst_lateness_s == pytest.approx(0.0045)


def test_single_token_has_no_tpot_violation():
    o = evaluate(LAT, ARRIVAL, [ARRIVAL + 0.05], finish_time=ARRIVAL + 0.05)
    assert o.tpot_ok is True and o.attained


def test_no_tokens_latency_not_attained():
    o = evaluate(LAT, ARRIVAL, [], finish_time=ARRIVAL + 1.0)
    assert o.ttft_s is None
    assert o.ttft_ok is False and o.tpot_ok is False
    assert o.worst_lateness_s is None
    assert o.on_time_tokens == 0 and o.output_tokens == 0
    assert not o.attained


def test_ttft_only_spec_has_no_tpot_verdict():
    s = SloSpec(ttft_ms=100.0, slo_class=SloClass.LATENCY)
    # without tpot every token is due at ttft
    times = [ARRIVAL + 0.05, ARRIVAL + 0.09, ARRIVAL + 0.2]
    o = evaluate(s, ARRIVAL, times, finish_time=times[-1])
    assert o.tpot_ok is None
    assert o.ttft_ok is True
    assert o.on_time_tokens == 2
    assert o.attained  # no tpot target, ttft met


def test_deadline_met_and_missed():
    s = SloSpec(deadline_ms=500.0, slo_class=SloClass.DEADLINE)
    times = [ARRIVAL + 0.1, ARRIVAL + 0.3]
    met = evaluate(s, ARRIVAL, times, finish_time=ARRIVAL + 0.5)
    assert met.deadline_ok is True and met.attained
    assert met.ttft_ok is None and met.tpot_ok is None
    assert met.on_time_tokens == 2  # no DSLO: every token counts as on time
    assert met.worst_lateness_s is None
    assert met.e2e_s == pytest.approx(0.5)
    missed = evaluate(s, ARRIVAL, times, finish_time=ARRIVAL + 0.5001)
    assert missed.deadline_ok is False and not missed.attained


def test_deadline_abs_overrides_relative_deadline():
    s = SloSpec(deadline_ms=500.0, program_id="p", slo_class=SloClass.COMPOUND)
    # the program started 0.4 s before this stage arrived: its deadline is at ARRIVAL + 0.1
    program_due = ARRIVAL - 0.4 + 0.5
    o = evaluate(s, ARRIVAL, [ARRIVAL + 0.05], finish_time=ARRIVAL + 0.2, deadline_abs=program_due)
    assert o.deadline_ok is False  # would be True relative to this request's own arrival
    assert evaluate(s, ARRIVAL, [ARRIVAL + 0.05], finish_time=ARRIVAL + 0.2).deadline_ok is True
    # and the other way: a later absolute deadline than arrival + deadline_ms
    late_ok = evaluate(s, ARRIVAL, [], finish_time=ARRIVAL + 0.9, deadline_abs=ARRIVAL + 1.0)
    assert late_ok.deadline_ok is True


def test_unfinished_never_attained_and_misses_deadline():
    s = SloSpec(deadline_ms=500.0, slo_class=SloClass.DEADLINE)
    o = evaluate(s, ARRIVAL, [ARRIVAL + 0.01], finish_time=ARRIVAL + 0.1, finished=False)
    assert o.deadline_ok is False
    assert not o.finished and not o.attained


def test_unfinished_best_effort_not_attained_finished_is():
    be = SloSpec()
    assert evaluate(be, ARRIVAL, [ARRIVAL + 1], finish_time=ARRIVAL + 1).attained
    dropped = evaluate(be, ARRIVAL, [], finish_time=ARRIVAL + 1, finished=False)
    assert (dropped.ttft_ok, dropped.tpot_ok, dropped.deadline_ok) == (None, None, None)
    assert not dropped.attained


def test_unfinished_latency_with_on_time_tokens_not_attained():
    o = evaluate(LAT, ARRIVAL, [ARRIVAL + 0.01, ARRIVAL + 0.02], finish_time=ARRIVAL + 0.03, finished=False)
    assert o.ttft_ok and o.tpot_ok
    assert o.on_time_tokens == 2
    assert not o.attained


def test_to_dict_reports_milliseconds_and_verdicts():
    times = [ARRIVAL + 0.0501, ARRIVAL + 0.1202]
    o = evaluate(LAT, ARRIVAL, times, finish_time=ARRIVAL + 0.2)
    d = o.to_dict()
    assert d["spec"] == LAT.to_dict()
    assert d["ttft_ms"] == pytest.approx(50.1, abs=1e-3)
    assert d["e2e_ms"] == pytest.approx(200.0, abs=1e-3)
    assert d["output_tokens"] == 2
    assert d["on_time_tokens"] == 1  # token 1 due at 110 ms came at 120.2 ms
    assert d["worst_token_lateness_ms"] == pytest.approx(10.2, abs=1e-3)
    assert d["attained"] == {"ttft": True, "tpot": False, "deadline": None, "overall": False}


def test_to_dict_nulls_without_tokens():
    d = evaluate(SloSpec(), ARRIVAL, [], finish_time=ARRIVAL + 0.25, finished=False).to_dict()
    assert d["ttft_ms"] is None and d["worst_token_lateness_ms"] is None
    assert d["e2e_ms"] == pytest.approx(250.0)
    assert d["attained"]["overall"] is False


# --- properties against a from-scratch reference --------------------------------------------

gaps = st.lists(st.floats(min_value=0.0, max_value=0.05, allow_nan=False), min_size=1, max_size=30)


@FAST
@given(
    ttft_ms=st.integers(1, 200),
    tpot_ms=st.integers(1, 50),
    first=st.floats(min_value=0.0, max_value=0.3, allow_nan=False),
    gaps=gaps,
)
def test_tpot_matches_reference_dslo(ttft_ms, tpot_ms, first, gaps):
    slo = SloSpec(ttft_ms=float(ttft_ms), tpot_ms=float(tpot_ms), slo_class=SloClass.LATENCY)
    rel = [first]
    for g in gaps:
        rel.append(rel[-1] + g)
    times = [ARRIVAL + r for r in rel]
    o = evaluate(slo, ARRIVAL, times, finish_time=times[-1])
    due = [ARRIVAL + (ttft_ms + i * tpot_ms) / 1000.0 for i in range(len(times))]
    late = [t - d for t, d in zip(times, due)]
    assume(all(abs(x) > 1e-9 for x in late))  # keep clear of float ties at the due time
    assert o.output_tokens == len(times)
    assert o.on_time_tokens == sum(x <= 0 for x in late)
    assert o.worst_lateness_s == pytest.approx(max(late), abs=1e-9)
    assert o.tpot_ok == all(x < 0 for x in late[1:])
    assert o.ttft_ok == (times[0] - ARRIVAL <= ttft_ms / 1000.0)
    assert o.attained == (o.ttft_ok and o.tpot_ok)


@FAST
@given(
    tpot_ms=st.integers(5, 50),
    n=st.integers(2, 40),
    bank=st.floats(min_value=0.0, max_value=1.0),
)
def test_early_first_token_allows_one_proportional_stall(tpot_ms, n, bank):
    # The first token arrives `slack` early; tokens after it come exactly every tpot except one
    # stall of up to `slack` extra seconds. DSLO must accept it: the stall is covered by the bank.
    ttft_ms = 100.0
    slack = 0.05 * (0.1 + bank * 0.9)
    slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=float(tpot_ms), slo_class=SloClass.LATENCY)
    times = [ARRIVAL + ttft_ms / 1000 - slack]
    for i in range(1, n):
        extra = slack * 0.99 if i == 1 else 0.0
        times.append(times[-1] + tpot_ms / 1000 + extra)
    o = evaluate(slo, ARRIVAL, times, finish_time=times[-1])
    assert o.tpot_ok is True
    assert o.on_time_tokens == n
    # A per-gap TPOT rule would have failed on the stall gap.
    assert times[1] - times[0] > tpot_ms / 1000


@FAST
@given(
    deadline_ms=st.integers(1, 2000),
    finish=st.floats(min_value=0.0, max_value=3.0, allow_nan=False),
    finished=st.booleans(),
)
def test_deadline_property(deadline_ms, finish, finished):
    slo = SloSpec(deadline_ms=float(deadline_ms), slo_class=SloClass.DEADLINE)
    o = evaluate(slo, ARRIVAL, [], finish_time=ARRIVAL + finish, finished=finished)
    assert o.deadline_ok == (finished and ARRIVAL + finish <= ARRIVAL + deadline_ms / 1000.0)
    assert o.attained == o.deadline_ok
