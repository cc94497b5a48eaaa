"""JITServe power-of-K routing with replica-specific GMAX priorities."""

from __future__ import annotations

import pytest

from router.policies.jit import JitParams, JitPolicy, on_time_tokens
from tests.unit.router._policy_views import deadline_slo, latency_slo, request, worker


def _req(deadline_ms=10_000.0):
    return request("r", prompt=1000, slo=deadline_slo(deadline_ms), predicted_output_tokens=100)


FAST = worker("fast", decode_s_per_token=0.01, prefill_s_per_token=0.0001)
SLOW = worker("slow", decode_s_per_token=0.05, prefill_s_per_token=0.0002)


def test_highest_priority_copy_wins() -> None:
    d = JitPolicy(JitParams(k=2)).choose(_req(), [SLOW, FAST], now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("fast", "gmax_priority", False)
    # goodput / t_gen = (1000 + 100) / (0.01 · 100)
    assert d.detail["priority"] == pytest.approx(1100.0)


def test_a_copy_that_misses_has_zero_goodput() -> None:
    queued = worker("fast", decode_s_per_token=0.01, queue_delay_s=20.0)
    assert JitPolicy(JitParams(k=2)).choose(_req(), [queued, SLOW], now=0.0).worker_id == "slow"


def test_equal_priority_goes_to_the_smallest_positive_slack() -> None:
    early = worker("early", decode_s_per_token=0.02)
    later = worker("later", decode_s_per_token=0.02, queue_delay_s=3.0)
    assert JitPolicy(JitParams(k=2)).choose(_req(), [early, later], now=0.0).worker_id == "later"


def test_late_everywhere_is_best_effort_with_least_overshoot() -> None:
    d = JitPolicy(JitParams(k=2)).choose(_req(deadline_ms=100), [SLOW, FAST], now=0.0)
    assert (d.worker_id, d.reason, d.best_effort) == ("fast", "late_everywhere", True)


def test_samples_k_copies_deterministically() -> None:
    workers = [worker(f"w{i}", decode_s_per_token=0.05) for i in range(9)] + [FAST]
    workers.append(worker("down", decode_s_per_token=0.001, healthy=False))

    def picks(policy: JitPolicy, n: int = 40) -> list[str]:
        return [policy.choose(_req(), workers, now=0.0).worker_id for _ in range(n)]

    two = picks(JitPolicy(JitParams(k=2, seed=4)))
    assert two == picks(JitPolicy(JitParams(k=2, seed=4)))
    assert "down" not in two
    assert 0 < two.count("fast") < 40  # chosen exactly when it is one of the two copies
    assert set(picks(JitPolicy(JitParams(k=len(workers))), 5)) == {"fast"}
    assert JitPolicy(JitParams(k=3)).choose(_req(), workers, now=0.0).detail["copies"] == 3


def test_latency_goodput_counts_tokens_meeting_their_dslo() -> None:
    assert on_time_tokens(k=0.5, slope=0.0, n=10, has_tpot=True) == 10
    assert on_time_tokens(k=0.5, slope=0.1, n=10, has_tpot=True) == 6  # j ≤ 5
    assert on_time_tokens(k=-0.5, slope=-0.1, n=10, has_tpot=True) == 5  # j ≥ 5
    assert on_time_tokens(k=-0.1, slope=0.1, n=10, has_tpot=True) == 0
    assert on_time_tokens(k=-0.1, slope=0.0, n=10, has_tpot=False) == 0
    # Latency SLO: 500 ms TTFT, 20 ms TPOT. FAST keeps pace, SLOW falls behind after a few tokens.
    req = request("r", prompt=1000, slo=latency_slo(500, 20), predicted_output_tokens=100)
    assert JitPolicy(JitParams(k=2)).choose(req, [SLOW, FAST], now=0.0).worker_id == "fast"


def test_bad_k() -> None:
    with pytest.raises(ValueError):
        JitPolicy(JitParams(k=0))


def test_the_idle_replica_wins_whichever_is_listed_first() -> None:
    busy = worker("busy", decode_s_per_token=0.01, queue_delay_s=20.0, queue_len=8)  # its copy misses
    idle = worker("idle", decode_s_per_token=0.01)
    for order in ([busy, idle], [idle, busy]):
        assert JitPolicy(JitParams(k=2)).choose(_req(), order, now=0.0).worker_id == "idle"
