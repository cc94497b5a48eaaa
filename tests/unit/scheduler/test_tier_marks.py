"""The engine's best-effort tier marks, as the plan path hands them over: by positions and the
positions whose tier changes (RequestStates.mark_tier_at) they must leave every request's tier,
and the set of requests a view builder refreshes, as the per-request rid path (mark_tier) does."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.components.request_state import RequestStates
from scheduler.core.slo import SloClass, SloSpec
from tests.unit.scheduler._stand_in_engine import StandInReq

SPECS = (
    SloSpec(ttft_ms=300, tpot_ms=40, slo_class=SloClass.LATENCY),
    SloSpec(deadline_ms=4000, slo_class=SloClass.DEADLINE),
    SloSpec(),
)


def _states(reqs: list[StandInReq]) -> RequestStates:
    states = RequestStates()
    for req in reqs:
        states.of(req, 0.0)
    return states


def _flips(states: RequestStates, rids: list[str], in_tier: np.ndarray, best_effort: np.ndarray) -> np.ndarray:
    """What the plan path reads off the views (plan_path._tier_flips): the SLO requests whose
    tier flag differs from the new tier; the views of best-effort ones cannot tell."""
    flagged = np.array([states.is_declined(rid) for rid in rids], dtype=bool)
    return ((in_tier != flagged) & ~best_effort).nonzero()[0]


@pytest.mark.parametrize("seed", range(30))
def test_positions_mark_the_tier_as_rids_do(seed: int) -> None:
    rng = random.Random(seed)
    reqs = [StandInReq(f"r{i}", 10 + i, spec=SPECS[rng.randrange(len(SPECS))]) for i in range(40)]
    by_rid, by_position = _states(reqs), _states(reqs)
    unknown = [f"u{i}" for i in range(5)]  # queued, not yet seen by the states (no view yet)
    for _ in range(25):
        if rng.random() < 0.2:  # one leaves: its tier mark goes with it
            rid = rng.choice(reqs).rid
            by_rid.forget(rid)
            by_position.forget(rid)
        queue = rng.sample([r.rid for r in reqs] + unknown, rng.randrange(1, 45))
        best_effort = np.array([rid in by_rid and by_rid.get(rid).slo.is_best_effort for rid in queue], dtype=bool)  # type: ignore[union-attr]
        share = rng.choice((0.0, 0.1, 0.5, 0.9, 1.0))
        tier_at = np.array([i for i in range(len(queue)) if rng.random() < share], dtype=np.int64)
        in_tier = np.zeros(len(queue), dtype=bool)
        in_tier[tier_at] = True
        flips_at = _flips(by_position, queue, in_tier, best_effort)
        if rng.random() < 0.3:  # a stale flip (a view read before the last mark) changes nothing
            flips_at = np.union1d(flips_at, rng.sample(range(len(queue)), 1)).astype(np.int64)

        by_rid.mark_tier(queue, frozenset(queue[i] for i in tier_at.tolist()))
        by_position.mark_tier_at(queue, tier_at, flips_at, best_effort.nonzero()[0])

        assert by_position.declined == by_rid.declined
        assert by_position.take_tier_changes() == by_rid.take_tier_changes()
    assert any(by_rid.get(r.rid) is not None and by_rid.get(r.rid).slo.is_best_effort for r in reqs)  # type: ignore[union-attr]
