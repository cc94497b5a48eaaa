"""PolyServe's TPOT tiers decide PD placements (issue 48): the decode view carries the prefill
partner's predicted finish instead of adding it to the decode agent's measured wait (which
already holds the remote prefill), and both halves of a pair share one TTFT budget."""

from __future__ import annotations

from benchmarks.simulator.pool import card
from benchmarks.simulator.routing import SimRouter
from benchmarks.simulator.worker import DECODE, PREFILL, EngineOptions, SimWorker
from router.pd import PrefillChooser, decode_side_views
from router.policies.polyserve import PolyServeParams, PolyServePolicy
from router.protocol import LoadReport
from router.routing_views import RouteRequest, WorkerView
from scheduler.core.slo import SloSpec
from tests.unit.router._fake_worker import load_report

PREFILL_S_PER_TOKEN = 1e-4


def _report(wid: str, seq: int, *, queue_delay_s: float, iteration_s: float, queue_len: int = 0) -> LoadReport:
    measured = {"queue_delay_s": queue_delay_s, "decode_s_per_token": iteration_s, "iteration_s": iteration_s}
    return load_report(wid, seq, queue_len=queue_len, prefill_s_per_token=PREFILL_S_PER_TOKEN, **measured)


def _pd_router(decode_wait_s: float, decode_queue: int = 0) -> SimRouter:
    """One prefill and two decode H100s behind PolyServe (tiers 50 and 100 ms); the decode agents
    report `decode_wait_s` of measured wait: Submit to first token, remote prefill included."""
    now = [10.0]
    h100 = card("h100")
    workers = [
        SimWorker("p0", h100, PREFILL, EngineOptions(), lambda: now[0]),
        SimWorker("d0", h100, DECODE, EngineOptions(), lambda: now[0]),
        SimWorker("d1", h100, DECODE, EngineOptions(), lambda: now[0]),
    ]
    router = SimRouter("polyserve", {"tiers_ms": [50.0, 100.0]}, workers, lambda: now[0], length_predictor=None)
    router.on_report("p0", _report("p0", 1, queue_delay_s=0.0, iteration_s=0.02))
    for wid in ("d0", "d1"):
        router.on_report(wid, _report(wid, 1, queue_delay_s=decode_wait_s, iteration_s=0.01, queue_len=decode_queue))
    return router


def _place(router: SimRouter, rid: str, ttft_ms: float = 300.0, tpot_ms: float = 50.0) -> str:
    """Routes one request and assigns it as the simulator does; the decode worker it went to."""
    flight = router.flights[rid] = _flight(router, rid, ttft_ms, tpot_ms)
    choice = router.choose(flight)
    assert choice is not None
    decision, prefill = choice
    assert prefill == "p0"  # a decode placement names its prefill partner
    router.assign(flight, decision.worker_id, prefill, flight.route.prompt_tokens)
    return decision.worker_id


def _flight(router: SimRouter, rid: str, ttft_ms: float, tpot_ms: float):  # type: ignore[no-untyped-def]
    from benchmarks.simulator.routing import Flight

    slo = SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms)
    return Flight(router.route_request(rid, 500, slo, router.clock(), 64))


def test_a_tier_decides_pd_placements_although_the_decode_agents_wait_holds_the_remote_prefill() -> None:
    # The decode agents measured 0.2 s of wait, all of it remote prefill. Added to the prefill
    # prediction (0.02 + 500 x 0.1 ms = 0.07 s) and held to the margin, it overran the 300 ms
    # TTFT and every placement fell to best effort.
    router = _pd_router(decode_wait_s=0.2)
    first = _place(router, "a")
    second = _place(router, "b")
    third = _place(router, "c", tpot_ms=100.0)
    counters = router.counters
    assert counters.get("reason:scaled_up") == 1  # the 50 ms tier takes an unassigned instance
    assert counters.get("reason:tier") == 1  # then the tier's own instance decides
    assert counters.get("reason:promoted") == 1  # a 100 ms request fills the 50 ms instance first
    assert counters.get("reason:best_effort") is None
    assert second == first and third == first
    status = router.policy.status()["tiers"]
    assert status["50"]["routed"] == 2 and status["100"]["promoted"] == 1


def test_a_decode_instance_holding_transferred_requests_back_takes_no_more() -> None:
    # Its engine's admission cap binds (a reported queue): packing more onto it made new
    # requests wait there for a slot after their prefill, past their TTFT.
    router = _pd_router(decode_wait_s=0.0, decode_queue=3)
    _place(router, "a")
    assert router.counters.get("reason:best_effort") == 1
    assert router.counters.get("reason:tier") is None and router.counters.get("reason:scaled_up") is None


def _view(wid: str, role: str, **kw: float) -> WorkerView:
    return WorkerView(worker_id=wid, gpu="h100", kv_capacity_tokens=100_000, max_running=64, role=role, **kw)


def test_decode_view_queue_delay_is_the_prefill_prediction_not_added_to_the_measured_wait() -> None:
    chooser = PrefillChooser()
    views = [
        _view("p0", PREFILL, prefill_s_per_token=PREFILL_S_PER_TOKEN, iteration_s=0.02),
        _view("d0", DECODE, queue_delay_s=0.2, iteration_s=0.01),
    ]
    req = RouteRequest(rid="r", prompt_tokens=500, slo=SloSpec(ttft_ms=300.0, tpot_ms=50.0), arrival_s=10.0)
    choice = chooser.choose(req, views[:1], 10.0)
    assert choice is not None and abs(choice.predicted_s - 0.07) < 1e-9
    (shown,) = decode_side_views(views, choice)
    assert abs(shown.queue_delay_s - 0.07) < 1e-9 and shown.prefill_s_per_token == 0.0


def test_the_decode_check_spends_what_the_prefill_chooser_left_of_the_ttft() -> None:
    # 0.12 s predicted for the prefill (the chooser packs to 300 ms / margin 2 at most); the
    # decode instance must fit twice its two passes (running, and the one formed under overlap)
    # into the rest. Both instances keep the 100 ms tier: only the TTFT tells them apart.
    policy = PolyServePolicy(PolyServeParams(tiers_ms=(100.0,)))
    req = RouteRequest(rid="r", prompt_tokens=500, slo=SloSpec(ttft_ms=300.0, tpot_ms=100.0), arrival_s=10.0)
    fast = _view("d0", DECODE, queue_delay_s=0.12, iteration_s=0.01, tpot_tier_ms=100.0)
    slow = _view("d1", DECODE, queue_delay_s=0.12, iteration_s=0.04, tpot_tier_ms=100.0)
    assert policy.fits(fast, req, 64, 100.0, 10.0)  # 0.12 + 2 x 2 x 0.015 = 0.18 <= 0.3
    assert not policy.fits(slow, req, 64, 100.0, 10.0)  # 0.12 + 2 x 2 x 0.06 = 0.36 > 0.3
    loose = RouteRequest(rid="r", prompt_tokens=500, slo=SloSpec(ttft_ms=1000.0, tpot_ms=100.0), arrival_s=10.0)
    assert policy.fits(slow, loose, 64, 100.0, 10.0)


TIGHT = SloSpec(ttft_ms=1000.0, tpot_ms=50.0)


def _two_tier_decode_pool() -> PolyServePolicy:
    """A policy whose decode instance d0 serves the 100 ms tier and d1 the 50 ms one."""
    policy = PolyServePolicy(PolyServeParams(tiers_ms=(50.0, 100.0), release_after_s=None))
    idle = [_view("d0", DECODE, iteration_s=0.01), _view("d1", DECODE, iteration_s=0.01)]
    loose = RouteRequest(rid="l", prompt_tokens=100, slo=SloSpec(ttft_ms=1000.0, tpot_ms=100.0), arrival_s=10.0)
    assert policy.choose(loose, idle, 10.0).worker_id == "d0"
    assert (
        policy.choose(RouteRequest(rid="t", prompt_tokens=100, slo=TIGHT, arrival_s=10.0), [idle[1]], 10.0).worker_id
        == "d1"
    )
    return policy


def test_best_effort_in_a_decode_pool_keeps_a_tight_request_off_looser_instances() -> None:
    # No instance fits (both engines hold transferred requests back). A 50 ms request then goes
    # to the instance already serving 50 ms, though the 100 ms one is less loaded: on the looser
    # one it would shrink the engine's batch cap for all its residents.
    full = [
        _view("d0", DECODE, iteration_s=0.01, queue_len=1, inflight=1),
        _view("d1", DECODE, iteration_s=0.01, queue_len=1, inflight=5),
    ]
    req = RouteRequest(rid="t2", prompt_tokens=100, slo=TIGHT, arrival_s=10.0)
    decision = _two_tier_decode_pool().choose(req, full, 10.0)
    assert decision.reason == "best_effort" and decision.worker_id == "d1"


def test_best_effort_in_a_decode_pool_sends_a_tight_request_past_a_full_tight_instance() -> None:
    # The 50 ms instance holds transferred requests back (its batch cap is full), the 100 ms one
    # has room: there the request decodes at once, its engine shrinking its batch to 50 ms, where
    # behind the full batch its second token would be late.
    views = [
        _view("d0", DECODE, iteration_s=0.06, running=8, inflight=8),  # room, but its step is past 50 ms
        _view("d1", DECODE, iteration_s=0.01, queue_len=1, inflight=3),
    ]
    req = RouteRequest(rid="t2", prompt_tokens=100, slo=TIGHT, arrival_s=10.0)
    decision = _two_tier_decode_pool().choose(req, views, 10.0)
    assert (decision.reason, decision.worker_id) == ("best_effort", "d0")
