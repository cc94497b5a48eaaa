"""GoodServe: Eq. 2 estimates, just-enough selection (Alg. 1), prefix reuse, tau-periodic migration."""

from __future__ import annotations

import pytest

from router.policies.goodserve import GoodServeParams, GoodServePolicy
from router.policies.request_estimates import output_tokens
from router.routing_views import RunningView
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, answer_due
from tests.unit.router._policy_views import deadline_slo, latency_slo, request, worker

# T for a 1000-token prompt and 100 output tokens: fast 1.1 s, mid 5.7 s, slow 21.4 s.
FAST = worker("fast", queue_delay_s=0.0, prefill_s_per_token=0.0001, decode_s_per_token=0.01)
MID = worker("mid", queue_delay_s=0.5, prefill_s_per_token=0.0002, decode_s_per_token=0.05, gpu="a100")
SLOW = worker("slow", queue_delay_s=1.0, prefill_s_per_token=0.0004, decode_s_per_token=0.2, gpu="a40")
CLUSTER = [FAST, MID, SLOW]


def _req(rid="r", deadline_ms=10_000.0, **kw):
    kw.setdefault("predicted_output_tokens", 100)
    return request(rid, prompt=1000, slo=deadline_slo(deadline_ms), **kw)


def test_picks_the_slowest_worker_that_meets_the_deadline() -> None:
    d = GoodServePolicy().choose(_req(), CLUSTER, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("mid", "just_enough", False)
    assert d.detail["t_est"] == pytest.approx(5.7)
    loose = GoodServePolicy().choose(_req(deadline_ms=30_000), CLUSTER, now=0.0)
    assert loose.worker_id == "slow"


def test_infeasible_requests_can_go_to_the_least_loaded_worker_instead_of_the_most_capable() -> None:
    """The paper's best effort piles hopeless requests on the fastest card; `least_loaded`
    spreads them, and feasible requests are still placed just enough."""
    busy_fast = worker("fast", queue_delay_s=0.0, prefill_s_per_token=0.0001, decode_s_per_token=0.01, running=9)
    busy_mid = worker("mid", queue_delay_s=0.5, prefill_s_per_token=0.0002, decode_s_per_token=0.05, running=3)
    idle_slow = worker("slow", queue_delay_s=1.0, prefill_s_per_token=0.0004, decode_s_per_token=0.2, gpu="a40")
    pool = [busy_fast, busy_mid, idle_slow]
    paper = GoodServePolicy().choose(_req(deadline_ms=1000), pool, now=0.0)
    assert (paper.worker_id, paper.reason) == ("fast", "min_overshoot")
    spread = GoodServePolicy(GoodServeParams(infeasible="least_loaded"))
    d = spread.choose(_req(deadline_ms=1000), pool, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("slow", "infeasible_least_loaded", True)
    assert d.detail["t_est"] == pytest.approx(21.4)
    assert spread.choose(_req(), pool, now=0.0).worker_id == "mid"  # feasible: unchanged
    with pytest.raises(ValueError, match="infeasible"):
        GoodServeParams(infeasible="drop")


def test_budget_is_measured_from_now() -> None:
    # 10 s deadline, 5 s already gone: mid (5.7 s) no longer makes it.
    assert GoodServePolicy().choose(_req(), CLUSTER, now=5.0).worker_id == "fast"


def test_minimises_overshoot_when_nothing_meets_the_deadline() -> None:
    d = GoodServePolicy().choose(_req(deadline_ms=1000), CLUSTER, now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("fast", "min_overshoot", True)


def test_within_a_speed_class_the_least_loaded_wins() -> None:
    """Two identical cards: the busier one measures a slightly slower decode; it must not get
    every request (the literal rule herds a burst onto it)."""
    idle = worker("idle", queue_delay_s=0.1, decode_s_per_token=0.050)
    busy = worker("busy", queue_delay_s=2.0, decode_s_per_token=0.055)
    fast = worker("fast", queue_delay_s=0.0, decode_s_per_token=0.01)
    assert GoodServePolicy().choose(_req(), [busy, idle, fast], now=0.0).worker_id == "idle"
    strict = GoodServePolicy(GoodServeParams(speed_tolerance=0.0))  # the literal rule: the slower-measuring card
    assert strict.choose(_req(), [busy, idle, fast], now=0.0).worker_id == "busy"
    with pytest.raises(ValueError):
        GoodServePolicy(GoodServeParams(speed_tolerance=-0.1))


def test_prefix_reuse_makes_a_slower_worker_feasible() -> None:
    cached = worker("cached", prefill_s_per_token=0.002, decode_s_per_token=0.01)  # 8 s of prefill
    fast = worker("fast", prefill_s_per_token=0.0001, decode_s_per_token=0.005)
    hashes = tuple(range(64))  # 64 blocks of 64 tokens cover the 4000-token prompt
    req = request("r", prompt=4000, slo=deadline_slo(5000), predicted_output_tokens=100, prefix_hashes=hashes)
    policy = GoodServePolicy()
    assert policy.choose(req, [cached, fast], now=0.0).worker_id == "fast"
    policy = GoodServePolicy()
    policy.on_routed(req, "cached")
    d = policy.choose(req, [cached, fast], now=0.0)
    assert d.worker_id == "cached"
    assert d.detail["reuse_tokens"] == 4000
    assert d.detail["t_est"] == pytest.approx(1.0)


def test_output_length_and_deadline_fallbacks() -> None:
    assert output_tokens(request(predicted_output_tokens=40, max_new_tokens=90)) == 40
    assert output_tokens(request(max_new_tokens=90)) == 90
    assert output_tokens(request()) == DEFAULT_OUTPUT_LEN
    assert answer_due(latency_slo(1000, 50), 2.0, 100) == pytest.approx(2.0 + 1.0 + 5.0)
    assert answer_due(deadline_slo(3000), 1.0, 100) == pytest.approx(4.0)
    assert answer_due(request().slo, 0.0, 100) is None


def test_latency_slo_uses_ttft_plus_tokens_times_tpot() -> None:
    # Due at 1 + 100·0.05 = 6 s: mid (5.7 s) is just enough.
    req = request("r", prompt=1000, slo=latency_slo(1000, 50), predicted_output_tokens=100)
    assert GoodServePolicy().choose(req, CLUSTER, now=0.0).worker_id == "mid"


def test_no_slo_goes_to_least_loaded() -> None:
    busy = [worker("a", inflight=3), worker("b", inflight=1)]
    d = GoodServePolicy().choose(request(), busy, now=0.0)
    assert (d.worker_id, d.best_effort) == ("b", False)


def _running(rid, worker_id, deadline_ms=10_000.0, generated=10, first_token_s=0.5):
    return RunningView(_req(rid, deadline_ms), worker_id, generated=generated, first_token_s=first_token_s)


def test_migration_fires_only_every_tau_calls() -> None:
    policy = GoodServePolicy(GoodServeParams(tau=3))
    at_risk = [_running("late", "slow")]  # 90 tokens left at 0.2 s: 18 s > 9 s left
    assert policy.migrations(at_risk, CLUSTER, now=1.0) == []
    assert policy.migrations(at_risk, CLUSTER, now=1.0) == []
    # Both faster workers meet it after re-prefill; just-enough picks mid.
    assert policy.migrations(at_risk, CLUSTER, now=1.0) == [("late", "mid")]
    assert policy.migrations(at_risk, CLUSTER, now=1.0) == []


def test_migration_needs_a_miss_and_a_target_that_meets() -> None:
    policy = GoodServePolicy(GoodServeParams(tau=1))
    on_time = [_running("ok", "mid")]  # 90 · 0.05 = 4.5 s, 9 s left
    assert policy.migrations(on_time, CLUSTER, now=1.0) == []
    hopeless = [_running("lost", "slow", deadline_ms=1500)]  # even fast needs ~1 s with 0.5 s left
    assert policy.migrations(hopeless, CLUSTER, now=1.0) == []
    no_slo = [RunningView(request("be"), "slow", generated=1)]
    assert policy.migrations(no_slo, CLUSTER, now=1.0) == []


def test_migration_counts_target_queue_and_reprefill() -> None:
    policy = GoodServePolicy(GoodServeParams(tau=1))
    # Mid would need 0.5 + 0.0002·1010 + 0.05·90 = 5.2 s; only 4 s left, so the fast worker.
    assert policy.migrations([_running("late", "slow")], CLUSTER, now=6.0) == [("late", "fast")]
    queued = worker("fast", queue_delay_s=5.0, prefill_s_per_token=0.0001, decode_s_per_token=0.01)
    assert policy.migrations([_running("late", "slow")], [queued, MID, SLOW], now=6.0) == []


def test_rescues_go_to_the_least_loaded_card_of_the_slowest_class_that_meets() -> None:
    policy = GoodServePolicy(GoodServeParams(tau=1))
    mid_busy = worker("mid2", queue_delay_s=1.0, prefill_s_per_token=0.0002, decode_s_per_token=0.052, gpu="a100")
    assert policy.migrations([_running("late", "slow")], [FAST, mid_busy, MID, SLOW], now=1.0) == [("late", "mid")]


def test_migration_spreads_rescues_within_one_check() -> None:
    policy = GoodServePolicy(GoodServeParams(tau=1))
    slow_prefill = worker("fast", prefill_s_per_token=0.002, decode_s_per_token=0.01)
    # Each rescue re-prefills 1010 tokens (2.02 s) on fast; the second no longer fits in 4 s.
    late = [_running("a", "slow"), _running("b", "slow")]
    assert policy.migrations(late, [slow_prefill, SLOW], now=6.0) == [("a", "fast")]
