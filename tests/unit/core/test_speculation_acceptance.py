"""Draft acceptance (SLOs-Serve App. D): the per-verify MLE of α and the pooled tracker
(Acc(s) itself is the policy core's `acceptance`, tested in tests/unit/core/test_slos_serve.py)."""

from __future__ import annotations

import random

import pytest

from scheduler.core.speculation_acceptance import AcceptanceTracker, batch_alpha

# ---------------------------------------------------------------- batch_alpha: the MLE of one verify


@pytest.mark.parametrize(
    ("accepted", "steps", "want"),
    [
        ([3, 3], 3, 1.0),  # all accepted: 6 judged, no rejection
        ([0, 0], 3, 0.0),  # first draft rejected in both
        ([1, 3], 3, 4 / 5),  # 1 accepted of 2 judged, 3 of 3
        ([2], 4, 2 / 3),  # two accepted, the third rejected
        ([0, 4, 1], 4, 5 / 7),  # judged 1 + 4 + 2
    ],
)
def test_batch_alpha_is_accepted_over_judged(accepted: list[int], steps: int, want: float) -> None:
    assert batch_alpha(accepted, steps) == pytest.approx(want)


def test_batch_alpha_clips_out_of_range_counts() -> None:
    # more accepted than drafted is clipped to s (all judged, all accepted); negatives to 0
    assert batch_alpha([9, 9], 3) == 1.0
    assert batch_alpha([-2, -1], 3) == 0.0
    assert batch_alpha([5, 0], 3) == pytest.approx(3 / 4)


def test_batch_alpha_without_drafts_is_none() -> None:
    assert batch_alpha([], 3) is None
    assert batch_alpha([0, 0], 0) is None
    assert batch_alpha([1], -1) is None


# ---------------------------------------------------------------- AcceptanceTracker


def test_tracker_rejects_bad_decay() -> None:
    for decay in (0.0, -0.1, 1.0, 1.5):
        with pytest.raises(ValueError):
            AcceptanceTracker(decay=decay)


def test_tracker_pools_accepted_and_judged_counts() -> None:
    t = AcceptanceTracker(prior=0.5, decay=0.5, prior_weight=4.0)  # prior: 2 of 4 judged
    t.observe([3, 3], 3)  # 6 accepted of 6 judged
    assert t.alpha == pytest.approx((0.5 * 2 + 6) / (0.5 * 4 + 6))
    t.observe([0, 0, 0, 0], 3)  # 0 of 4
    assert t.alpha == pytest.approx((0.5 * 7 + 0) / (0.5 * 8 + 4))
    assert t.verifies == 2


def test_tracker_large_batch_outweighs_the_prior() -> None:
    t = AcceptanceTracker(prior=0.7, prior_weight=8.0)
    t.observe([1] * 40, 3)  # 40 accepted of 80 judged against 5.6 of 8
    assert t.alpha == pytest.approx((0.98 * 5.6 + 40) / (0.98 * 8 + 80))


def test_tracker_ignores_verifies_without_drafts() -> None:
    t = AcceptanceTracker(prior=0.42)
    t.observe([], 4)
    t.observe([0, 0, 0], 0)
    assert t.alpha == 0.42
    assert t.verifies == 0
    assert t.mean_accepted() is None


def test_mean_accepted_counts_per_request_verify() -> None:
    t = AcceptanceTracker()
    assert t.mean_accepted() is None
    t.observe([2, 0, 4], 4)
    assert t.mean_accepted() == pytest.approx(2.0)
    t.observe([1], 4)
    assert t.mean_accepted() == pytest.approx(7 / 4)
    t.observe([9], 4)  # clipped to the 4 drafted
    assert t.mean_accepted() == pytest.approx(11 / 5)
    assert t.request_verifies == 5


def _geometric_accepts(rng: random.Random, alpha: float, steps: int) -> int:
    """One request's verify: drafts accepted independently with probability α until the first
    rejection, at most `steps`."""
    accepted = 0
    while accepted < steps and rng.random() < alpha:
        accepted += 1
    return accepted


def _run_tracker(alpha: float, batch: int, seed: int, verifies: int = 400, steps: int = 4) -> list[float]:
    rng = random.Random(seed)
    t = AcceptanceTracker(prior=0.3 if alpha > 0.5 else 0.9)  # start far from the truth
    trace = []
    for _ in range(verifies):
        t.observe([_geometric_accepts(rng, alpha, steps) for _ in range(batch)], steps)
        trace.append(t.alpha)
    return trace


@pytest.mark.parametrize("alpha", [0.6, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tracker_converges_to_simulated_alpha(alpha: float, seed: int) -> None:
    trace = _run_tracker(alpha, batch=16, seed=seed)  # from a prior 0.3 away
    tail = trace[200:]
    assert abs(sum(tail) / len(tail) - alpha) < 0.03  # unbiased on average ...
    assert abs(trace[-1] - alpha) < 0.15  # ... and the last estimate is in the neighbourhood


@pytest.mark.parametrize("alpha", [0.6, 0.9])
def test_tracker_converges_for_small_batches_from_prior(alpha: float) -> None:
    # the mean of accepted drafts is the unbiased part even at batch size 1
    rng = random.Random(7)
    t = AcceptanceTracker()
    for _ in range(400):
        t.observe([_geometric_accepts(rng, alpha, 4)], 4)
    want = sum(alpha**k for k in range(1, 5))  # E[accepted] = α + α² + α³ + α⁴ for s = 4
    assert t.mean_accepted() == pytest.approx(want, abs=0.2)


@pytest.mark.parametrize("alpha", [0.6, 0.9])
def test_tracker_converges_with_one_request_per_verify(alpha: float) -> None:
    trace = _run_tracker(alpha, batch=1, seed=0, verifies=600)
    tail = trace[200:]
    assert abs(sum(tail) / len(tail) - alpha) < 0.05
