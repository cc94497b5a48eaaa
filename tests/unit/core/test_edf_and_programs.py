"""EDF ordering on each request's next binding deadline, the compound-program tracker and the
max_queue_ms admission check."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.core.policies.edf import EdfPolicy, deadline_key
from scheduler.core.programs import ProgramTracker
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON, expired_in_queue
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import RequestView
from tests.unit.core.policy_cases import policy_view

FAST = settings(max_examples=80, deadline=None)


def _lat(ttft_ms, tpot_ms=None):
    return SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)


def _dl(deadline_ms):
    return SloSpec(deadline_ms=deadline_ms, slo_class=SloClass.DEADLINE)


def _cmp(deadline_ms, program="p"):
    return SloSpec(deadline_ms=deadline_ms, program_id=program, slo_class=SloClass.COMPOUND)


def _req(rid, slo, arrival, **kw):
    return RequestView(rid=rid, slo=slo, arrival=arrival, prompt_len=kw.pop("prompt_len", 8), **kw)


def _view(waiting):
    return policy_view(waiting, cap=8, now=100.0, free_kv=1000, total_kv=1000)


def _order(waiting):
    return EdfPolicy().plan(_view(waiting)).order


# --- EDF ----------------------------------------------------------------------------------------


def test_latency_waiting_keyed_by_first_token_deadline():
    # a: arrives first but with a loose TTFT; b: later, tight TTFT -> b first.
    a = _req("a", _lat(1000.0, 10.0), arrival=0.0)  # first token due 1.0
    b = _req("b", _lat(100.0, 10.0), arrival=0.5)  # first token due 0.6
    assert _order([a, b]) == ["b", "a"]
    assert deadline_key(b) == (0, 0.6, 0.5)


def test_latency_key_uses_next_token_after_some_generated():
    # A retracted request that already produced 50 tokens: next token due at ttft + 50*tpot.
    resumed = _req("r", _lat(100.0, 20.0), arrival=0.0, generated=50)  # due 0.1 + 1.0 = 1.1
    fresh = _req("f", _lat(500.0, 20.0), arrival=0.2)  # due 0.7
    assert _order([resumed, fresh]) == ["f", "r"]
    assert deadline_key(resumed)[1] == 1.1


def test_deadline_and_latency_interleave_by_absolute_time():
    lat = _req("lat", _lat(300.0), arrival=0.0)  # 0.3
    dl = _req("dl", _dl(200.0), arrival=0.05)  # 0.25
    dl_late = _req("dl_late", _dl(2000.0), arrival=0.0)  # 2.0
    assert _order([dl_late, lat, dl]) == ["dl", "lat", "dl_late"]


def test_deadline_request_ignores_its_ttft_for_ordering():
    # class deadline with a ttft: keyed by the end-to-end deadline, not the first-token target
    dl = _req("dl", SloSpec(ttft_ms=10.0, deadline_ms=900.0, slo_class=SloClass.DEADLINE), arrival=0.0)
    lat = _req("lat", _lat(500.0), arrival=0.0)
    assert _order([dl, lat]) == ["lat", "dl"]


def test_compound_measured_from_program_arrival():
    # Both carry a 1 s program deadline; stage "late_stage" arrived later but its program started
    # at t=0, so it is due at 1.0, before "early_prog" (program arrival 0.5 -> due 1.5).
    late_stage = _req("late_stage", _cmp(1000.0, "p1"), arrival=0.9, program_arrival=0.0)
    early_prog = _req("early_prog", _cmp(1000.0, "p2"), arrival=0.5, program_arrival=0.5)
    assert _order([early_prog, late_stage]) == ["late_stage", "early_prog"]
    assert deadline_key(late_stage) == (0, 1.0, 0.9)


def test_compound_without_program_arrival_falls_back_to_own_arrival():
    r = _req("c", _cmp(1000.0), arrival=2.0)
    assert deadline_key(r) == (0, 3.0, 2.0)


def test_stage_deadline_overrides_program_deadline():
    r = _req("c", _cmp(1000.0), arrival=0.0, program_arrival=0.0, stage_deadline=0.2)
    other = _req("d", _dl(300.0), arrival=0.0)
    assert _order([other, r]) == ["c", "d"]


def test_best_effort_last_in_arrival_order():
    be_old = _req("be_old", SloSpec(), arrival=0.0)
    be_new = _req("be_new", SloSpec(), arrival=5.0)
    loose = _req("loose", _dl(1e6), arrival=10.0)  # due in ~11.6 days, still before best-effort
    assert _order([be_new, loose, be_old]) == ["loose", "be_old", "be_new"]
    assert deadline_key(be_old) == (1, math.inf, 0.0)


def test_ties_broken_by_arrival():
    # same absolute deadline 1.0: the earlier arrival goes first
    a = _req("a", _dl(500.0), arrival=0.5)
    b = _req("b", _dl(1000.0), arrival=0.0)
    assert _order([a, b]) == ["b", "a"]


def test_empty_queue():
    assert _order([]) == []


def test_reused_view_is_rekeyed_when_its_generated_count_changes():
    # The adapter passes the same view object until the request changes, then updates it in
    # place: a retracted request's next token due moves with each token it had generated.
    policy = EdfPolicy()
    resumed = _req("r", _lat(100.0, 20.0), arrival=0.0)  # first token due 0.1
    fresh = _req("f", _lat(500.0, 20.0), arrival=0.2)  # due 0.7
    assert policy.plan(_view([fresh, resumed])).order == ["r", "f"]
    resumed.generated = 50  # due 0.1 + 1.0 = 1.1
    assert policy.plan(_view([fresh, resumed])).order == ["f", "r"]
    stand_in = _req("r", _lat(100.0, 20.0), arrival=0.0)  # a new view under the same rid
    assert policy.plan(_view([fresh, stand_in])).order == ["r", "f"]


slo_choices = st.sampled_from(["be", "lat", "dl", "cmp"])


@st.composite
def waiting_requests(draw):
    n = draw(st.integers(0, 12))
    reqs = []
    for i in range(n):
        kind = draw(slo_choices)
        arrival = draw(st.floats(0.0, 10.0, allow_nan=False))
        if kind == "be":
            reqs.append(_req(f"r{i}", SloSpec(), arrival))
        elif kind == "lat":
            ttft = draw(st.floats(1.0, 2000.0))
            tpot = draw(st.none() | st.floats(1.0, 100.0))
            gen = draw(st.integers(0, 20))
            reqs.append(_req(f"r{i}", _lat(ttft, tpot), arrival, generated=gen))
        elif kind == "dl":
            reqs.append(_req(f"r{i}", _dl(draw(st.floats(1.0, 5000.0))), arrival))
        else:
            prog_arrival = arrival - draw(st.floats(0.0, 5.0))
            reqs.append(_req(f"r{i}", _cmp(draw(st.floats(1.0, 5000.0))), arrival, program_arrival=prog_arrival))
    return reqs


def _reference_deadline(r: RequestView) -> float | None:
    s = r.slo
    if s.slo_class is SloClass.LATENCY:
        return r.arrival + (s.ttft_ms + r.generated * (s.tpot_ms or 0.0)) / 1000.0
    if s.slo_class is SloClass.DEADLINE:
        return r.arrival + s.deadline_ms / 1000.0
    if s.slo_class is SloClass.COMPOUND:
        base = r.program_arrival if r.program_arrival is not None else r.arrival
        return base + s.deadline_ms / 1000.0
    return None


@FAST
@given(waiting_requests())
def test_edf_order_property(reqs):
    order = _order(reqs)
    by_rid = {r.rid: r for r in reqs}
    assert sorted(order) == sorted(by_rid)  # a permutation of the waiting rids
    assert order == [r.rid for r in sorted(reqs, key=deadline_key)]  # the per-request key's order, ties stable
    deadlines = [_reference_deadline(by_rid[rid]) for rid in order]
    n_dl = sum(d is not None for d in deadlines)
    # every request with a deadline precedes every best-effort one
    assert all(d is not None for d in deadlines[:n_dl])
    assert all(d is None for d in deadlines[n_dl:])
    # deadlines non-decreasing (up to float rounding in the two computations)
    for x, y in zip(deadlines[:n_dl], deadlines[1:n_dl]):
        assert x <= y + 1e-9
    # best-effort tail in arrival order
    tail = [by_rid[rid].arrival for rid in order[n_dl:]]
    assert tail == sorted(tail)


# --- ProgramTracker -------------------------------------------------------------------------------


def test_first_arrival_kept():
    t = ProgramTracker()
    assert t.arrival("p", 10.0) == 10.0
    assert t.arrival("p", 12.0) == 10.0
    assert t.arrival("p", 15.0) == 10.0
    assert len(t) == 1


def test_out_of_order_earlier_arrival_becomes_first():
    t = ProgramTracker()
    t.arrival("p", 10.0)
    assert t.arrival("p", 8.0) == 8.0
    assert t.arrival("p", 11.0) == 8.0


def test_programs_independent():
    t = ProgramTracker()
    t.arrival("a", 1.0)
    assert t.arrival("b", 5.0) == 5.0
    assert t.arrival("a", 6.0) == 1.0
    assert len(t) == 2


def test_evict_idle_past_ttl_only():
    t = ProgramTracker(ttl_s=10.0)
    t.arrival("old", 0.0)
    t.arrival("old", 5.0)  # last seen at 5.0
    t.arrival("recent", 9.0)
    t.evict(now=15.0)  # old idle exactly 10 s: kept (strictly past ttl evicts)
    assert len(t) == 2
    t.evict(now=15.5)  # old idle 10.5 s: evicted; recent idle 6.5 s: kept
    assert len(t) == 1
    # the forgotten program starts afresh
    assert t.arrival("old", 20.0) == 20.0
    assert t.arrival("recent", 21.0) == 9.0


def test_last_seen_uses_latest_not_most_recent_call():
    t = ProgramTracker(ttl_s=10.0)
    t.arrival("p", 0.0)
    t.arrival("p", 20.0)
    t.arrival("p", 3.0)  # a late-reported early stage must not roll back last-seen
    t.evict(now=25.0)
    assert len(t) == 1
    assert t.arrival("p", 26.0) == 0.0


def test_capacity_overflow_evicts_least_recently_seen():
    t = ProgramTracker(ttl_s=1e9, max_programs=4)
    for i in range(4):
        t.arrival(f"p{i}", float(i))
    assert len(t) == 4
    t.arrival("p4", 4.0)  # 5 > 4: nothing stale, so the oldest are dropped down to max // 2
    assert len(t) == 2
    # the survivors are the most recently seen, with their first arrivals intact
    assert t.arrival("p4", 9.0) == 4.0
    assert t.arrival("p3", 9.0) == 3.0
    assert t.arrival("p0", 9.0) == 9.0  # forgotten


def test_capacity_overflow_prefers_stale_eviction():
    t = ProgramTracker(ttl_s=5.0, max_programs=3)
    t.arrival("stale", 0.0)
    t.arrival("a", 10.0)
    t.arrival("b", 11.0)
    t.arrival("c", 12.0)  # 4 > 3: evicting the stale one is enough
    assert len(t) == 3
    assert t.arrival("a", 13.0) == 10.0
    assert t.arrival("stale", 13.0) == 13.0


@FAST
@given(st.lists(st.tuples(st.sampled_from("abcde"), st.floats(0.0, 100.0, allow_nan=False)), max_size=40))
def test_first_arrival_is_minimum_seen(events):
    t = ProgramTracker()
    seen: dict[str, float] = {}
    for pid, at in events:
        seen[pid] = min(seen.get(pid, at), at)
        assert t.arrival(pid, at) == seen[pid]
    assert len(t) == len(seen)


# --- queue timeout -------------------------------------------------------------------------------


def test_expired_in_queue():
    q = SloSpec(max_queue_ms=500.0)
    reqs = [
        _req("expired", q, arrival=0.0),
        _req("boundary", q, arrival=0.5),  # waited exactly 0.5 s: not yet expired
        _req("young", q, arrival=0.8),
        _req("no_limit", SloSpec(), arrival=-100.0),
        _req("started", q, arrival=0.0, first_token_time=0.2),
        _req("lat_expired", SloSpec(ttft_ms=100.0, max_queue_ms=100.0, slo_class=SloClass.LATENCY), arrival=0.85),
    ]
    assert expired_in_queue(reqs, now=1.0) == ["expired", "lat_expired"]
    assert expired_in_queue([], now=1.0) == []
    assert QUEUE_TIMEOUT_REASON == "slo_queue_timeout"


@FAST
@given(
    st.lists(
        st.tuples(st.none() | st.floats(1.0, 5000.0), st.floats(0.0, 10.0), st.booleans()),
        max_size=15,
    ),
    st.floats(0.0, 20.0),
)
def test_expired_in_queue_property(specs, now):
    reqs = [
        _req(f"r{i}", SloSpec(max_queue_ms=mq), arrival=a, first_token_time=(a if started else None))
        for i, (mq, a, started) in enumerate(specs)
    ]
    expected = [
        f"r{i}" for i, (mq, a, started) in enumerate(specs) if mq is not None and not started and now - a > mq / 1000.0
    ]
    assert expired_in_queue(iter(reqs), now) == expected
