"""PolyServe: tier binning, load-gradient placement, lazy promotion, scale-up/down, status()."""

from __future__ import annotations

import pytest

from router.policies.polyserve import PolyServeParams, PolyServePolicy
from tests.unit.router._policy_views import latency_slo, request, worker

TIERS = (25.0, 50.0, 100.0)


def _inst(wid, tier, running=4, iteration_s=0.02, **kw):
    kw.setdefault("max_running", 16)
    return worker(wid, tpot_tier_ms=tier, running=running, iteration_s=iteration_s, **kw)


def _req(rid="r", tpot=60.0, ttft=1000.0, **kw):
    return request(rid, prompt=500, slo=latency_slo(ttft, tpot), predicted_output_tokens=100, **kw)


def test_binning_rounds_down_to_a_configured_tier() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    assert policy.tier_of(_req(tpot=60)) == 50.0
    assert policy.tier_of(_req(tpot=100)) == 100.0
    assert policy.tier_of(_req(tpot=10)) == 25.0  # tighter than every tier: the tightest
    assert policy.tier_of(request(slo=latency_slo(500))) is None
    assert PolyServePolicy().tier_of(_req(tpot=60)) == 60.0


def test_routes_to_the_highest_load_instance_that_fits() -> None:
    ws = [_inst("low", 50.0, running=2), _inst("high", 50.0, running=10, iteration_s=0.03), _inst("x", 100.0)]
    d = PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), ws, now=0.0)
    assert (d.worker_id, d.reason) == ("high", "tier")
    # One more request makes `high` exceed 50 ms (0.048 · 1.05): next highest load.
    ws[1] = _inst("high", 50.0, running=10, iteration_s=0.048)
    assert PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), ws, now=0.0).worker_id == "low"


def test_an_slo_lever_engine_keeps_a_tier_by_its_plain_decode_step() -> None:
    # Its measured steps carry prefill chunks (60 ms > the 50 ms tier), but an engine with the
    # SLO levers shrinks those chunks to keep its residents' TPOT: its 30 ms decode step decides.
    def busy(levers: bool):
        return _inst("busy", 50.0, running=10, iteration_s=0.06, decode_step_s=0.03, slo_levers=levers)

    stock = [busy(False), _inst("spare", 50.0, running=1)]
    assert PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), stock, now=0.0).worker_id == "spare"
    levered = [busy(True), _inst("spare", 50.0, running=1)]
    d = PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), levered, now=0.0)
    assert (d.worker_id, d.reason) == ("busy", "tier")
    # a decode step past the tier still refuses it
    levered[0] = _inst("busy", 50.0, running=10, iteration_s=0.06, decode_step_s=0.049, slo_levers=True)
    assert PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), levered, now=0.0).worker_id == "spare"


def test_ttft_counts_queue_iteration_wait_and_prefill() -> None:
    ws = [_inst("queued", 50.0, running=10, queue_delay_s=0.9, prefill_s_per_token=0.0002), _inst("free", 50.0)]
    # 0.9 + 0.02 + 0.1 > 1 s TTFT on the busier instance.
    assert PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), ws, now=0.0).worker_id == "free"


def test_the_ttft_estimate_must_fit_with_its_margin() -> None:
    # 0.5 s queue + 0.02 s iteration + 0.1 s prefill = 0.62 s: fits a 1 s TTFT bare, not twice over.
    ws = [_inst("busy", 50.0, running=10, queue_delay_s=0.5, prefill_s_per_token=0.0002), _inst("free", 50.0)]
    bare = PolyServePolicy(PolyServeParams(tiers_ms=TIERS, ttft_margin=1.0))
    assert bare.choose(_req(), ws, now=0.0).worker_id == "busy"
    assert PolyServePolicy(PolyServeParams(tiers_ms=TIERS)).choose(_req(), ws, now=0.0).worker_id == "free"
    with pytest.raises(ValueError, match="ttft_margin"):
        PolyServeParams(ttft_margin=0.5)


def test_placements_since_the_last_report_count_against_an_instance() -> None:
    # The reports stay as they were (running 10 and 2, empty queues, no measured delay); only
    # the router's in-flight counts grow. Each 500-token prompt is 0.25 s of prefill, so the
    # busier instance takes three before a fourth would miss its 1 s TTFT behind their prefill.
    # (Reading only the reports, load-gradient packing sent every placement to it.)
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS, ttft_margin=1.0))
    placed = {"high": 0, "low": 0}
    chosen = []
    for i in range(5):
        ws = [
            _inst(wid, 50.0, running=run, prefill_s_per_token=0.0005, inflight=run + placed[wid])
            for wid, run in (("high", 10), ("low", 2))
        ]
        wid = policy.choose(_req(f"r{i}"), ws, now=0.0).worker_id
        placed[wid] += 1
        chosen.append(wid)
    assert chosen == ["high", "high", "high", "low", "low"]
    # The batch slots count the same way: a full instance by in-flight count takes no more.
    full = _inst("full", 50.0, running=4, max_running=16, inflight=16)
    assert policy.choose(_req("s"), [full, _inst("room", 50.0, running=1)], now=0.0).worker_id == "room"


def test_promotes_lazily_only_when_the_tier_is_full() -> None:
    tight = _inst("tight", 25.0, running=12, iteration_s=0.01)
    room = _inst("room", 50.0, running=2)
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    assert policy.choose(_req("a"), [tight, room], now=0.0).worker_id == "room"
    full = _inst("room", 50.0, running=16)
    d = policy.choose(_req("b"), [tight, full], now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("tight", "promoted", False)


def test_best_effort_keeps_a_tight_request_off_a_looser_co_located_instance() -> None:
    """A co-located SLO-lever engine caps its batch at its tightest resident's TPOT too: when no
    instance fits the tier, a 25 ms request joins the one already serving 25 ms while it has
    room (its step past the tier), not the less loaded 100 ms one, whose batch it would shrink
    for every resident; once that one is full, the least loaded."""
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS, release_after_s=None))
    tight, loose = _inst("tight", 25.0, running=2, iteration_s=0.01), _inst("loose", 100.0, running=2)
    assert policy.choose(_req("t1", tpot=25.0), [tight, loose], now=0.0).worker_id == "tight"
    assert policy.choose(_req("l0", tpot=100.0), [tight, loose], now=0.0).worker_id == "loose"
    slow = [_inst("tight", 25.0, running=10, iteration_s=0.03), _inst("loose", 100.0, running=4)]
    d = policy.choose(_req("t2", tpot=25.0), slow, now=0.0)
    assert (d.worker_id, d.reason) == ("tight", "best_effort")
    full = [_inst("tight", 25.0, running=16, iteration_s=0.03), _inst("loose", 100.0, running=4)]
    d = policy.choose(_req("t3", tpot=25.0), full, now=0.0)
    assert (d.worker_id, d.reason) == ("loose", "best_effort")


def test_scales_up_from_the_pool_then_falls_back_to_best_effort() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    full = _inst("full", 50.0, running=16)
    pool = _inst("spare", None, running=1)
    d = policy.choose(_req("a"), [full, pool], now=0.0)
    assert (d.worker_id, d.reason) == ("spare", "scaled_up")
    assert policy.assignments == {"full": 50.0, "spare": 50.0}
    both_full = [full, _inst("spare", 50.0, running=16)]
    d = policy.choose(_req("b"), both_full, now=0.0)
    assert (d.reason, d.best_effort) == ("best_effort", True)
    status = policy.status()["tiers"]["50"]
    assert status["pending"] == 1 and status["best_effort"] == 1 and status["scaled_up"] == 1
    policy.on_finished("b", d.worker_id)
    assert policy.status()["tiers"]["50"]["pending"] == 0


def test_pending_instance_joins_the_tier_its_residents_belong_to() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    tight = _inst("tight", 25.0, running=2, iteration_s=0.01)
    full50 = _inst("full50", 50.0, running=16)
    assert policy.choose(_req("p"), [tight, full50], now=0.0).reason == "promoted"
    # `tight` holds only a tier-50 request: pending. Tier 50 scales up onto it before the pool.
    pool = _inst("pool", None, running=0)
    tight_full_for_25 = _inst("tight", 25.0, running=3, iteration_s=0.03)  # too slow for 25, fine for 50
    d = policy.choose(_req("q"), [tight_full_for_25, full50, pool], now=0.0)
    assert (d.worker_id, d.reason) == ("tight", "scaled_up")
    assert policy.assignments["tight"] == 50.0


def test_idle_instances_return_to_the_pool_after_a_while() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS, release_after_s=10.0))
    idle = _inst("idle", 100.0, running=0)
    busy = _inst("busy", 50.0, running=3, inflight=3)
    policy.choose(_req("a"), [idle, busy], now=0.0)
    assert policy.assignments["idle"] == 100.0
    policy.choose(_req("b"), [idle, busy], now=5.0)
    assert policy.assignments["idle"] == 100.0
    policy.choose(_req("c"), [idle, busy], now=10.0)
    assert policy.assignments["idle"] is None
    assert policy.status()["tiers"]["100"]["released"] == 1
    assert policy.status()["pool_instances"] == 1


def test_requests_without_tpot_go_to_the_pool() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    ws = [_inst("t50", 50.0, running=1), _inst("p1", None, running=5), _inst("p2", None, running=2)]
    d = policy.choose(request("be"), ws, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("p2", "pool", False)
    assert policy.status()["no_tpot_routed"] == 1


def test_status_counts_per_tier() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS))
    ws = [_inst("a", 50.0), _inst("b", 50.0), _inst("c", 100.0)]
    for i in range(3):
        policy.choose(_req(f"r{i}"), ws, now=0.0)
    s = policy.status()
    assert s["tiers"]["50"]["instances"] == 2 and s["tiers"]["50"]["routed"] == 3
    empty = dict.fromkeys(("pending", "routed", "promoted", "scaled_up", "best_effort", "released"), 0)
    assert s["tiers"]["100"] == {"instances": 1, "pending_instances": 1, **empty}


def test_an_instance_reporting_zero_load_forgets_missed_finishes() -> None:
    policy = PolyServePolicy(PolyServeParams(tiers_ms=TIERS, check_every_s=0.0))
    busy = _inst("a", 50.0, running=2, inflight=2)
    policy.choose(_req("r"), [busy], now=1.0)
    assert policy.status()["tiers"]["50"]["pending_instances"] == 0
    # No on_finished arrived, but a later report shows the instance empty.
    empty = _inst("a", 50.0, running=0, inflight=0, last_report_s=2.0)
    policy.choose(request("be"), [empty], now=3.0)
    assert policy.status()["tiers"]["50"]["pending_instances"] == 1


def test_without_configured_tiers_distinct_tpots_keep_the_policys_tables_bounded() -> None:
    """Every distinct TPOT is its own tier for placement, but a client sending a new TPOT on each
    request must not grow the policy's counts and status without bound."""
    policy = PolyServePolicy()
    ws = [_inst("a", None, running=0), _inst("b", None, running=0)]
    for i in range(2000):
        rid = f"r{i}"
        d = policy.choose(_req(rid, tpot=20.0 + i * 0.01), ws, now=float(i))
        policy.on_finished(rid, d.worker_id)
    tiers = policy.status()["tiers"]
    assert isinstance(tiers, dict) and 0 < len(tiers) <= 10  # one decade of the fixed grid
    assert sum(t["routed"] for t in tiers.values()) == 2000
    assert all(len(c) <= 1 for c in policy._tiers_on.values())  # finished tiers leave nothing behind
