"""Load-oblivious and single-metric baselines on hand examples."""

from __future__ import annotations

from router.policies.load_metrics import LeastRequestPolicy, LlumnixLoadPolicy, LowestTpmPolicy
from router.policies.spread import PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy, SeedParams
from tests.unit.router._policy_views import request, worker

WORKERS = [
    worker("a", inflight=5, tokens_per_minute=900.0, kv_used_tokens=80_000),
    worker("b", inflight=2, tokens_per_minute=1200.0, kv_used_tokens=10_000),
    worker("c", queue_len=1, running=2, tokens_per_minute=300.0, kv_used_tokens=50_000),
    worker("x", inflight=0, tokens_per_minute=0.0, healthy=False),
]


def _picks(policy, n: int, workers=WORKERS) -> list[str]:
    return [policy.choose(request(f"r{i}"), workers, now=0.0).worker_id for i in range(n)]


def test_round_robin_cycles_over_healthy_workers() -> None:
    assert _picks(RoundRobinPolicy(), 7) == ["a", "b", "c", "a", "b", "c", "a"]


def test_random_is_deterministic_for_a_seed_and_covers_healthy_workers() -> None:
    first = _picks(RandomPolicy(SeedParams(seed=3)), 60)
    assert first == _picks(RandomPolicy(SeedParams(seed=3)), 60)
    assert set(first) == {"a", "b", "c"}


def test_power_of_two_takes_the_less_loaded_of_two_draws() -> None:
    picks = _picks(PowerOfTwoPolicy(SeedParams(seed=1)), 60)
    assert picks == _picks(PowerOfTwoPolicy(SeedParams(seed=1)), 60)
    assert "x" not in picks
    assert "a" not in picks  # the most loaded healthy worker always loses its draw
    two = [worker("busy", inflight=9), worker("idle", inflight=1)]
    assert set(_picks(PowerOfTwoPolicy(SeedParams(seed=5)), 10, two)) == {"idle"}


def test_least_request_counts_inflight_or_queue_plus_running() -> None:
    assert _picks(LeastRequestPolicy(), 1) == ["b"]
    tie = [worker("p", inflight=1), worker("q", inflight=1)]
    assert _picks(LeastRequestPolicy(), 1, tie) == ["p"]


def test_lowest_tpm() -> None:
    assert _picks(LowestTpmPolicy(), 1) == ["c"]


def test_llumnix_most_free_kv() -> None:
    assert _picks(LlumnixLoadPolicy(), 1) == ["b"]
