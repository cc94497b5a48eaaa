"""Applying a plan to SGLang's waiting queue: the order, then the best-effort tier, and each
waiting request's tier flag, as a straightforward per-request pass would apply them."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from scheduler.components.plan_applier import held_positions, order_waiting, set_aside
from scheduler.components.request_state import RequestStates
from scheduler.core.plan_path import FinalPlan


class _Req:
    def __init__(self, rid: str) -> None:
        self.rid = rid


class _Stub:
    """A request as RequestStates.of reads it: no SLO attached (best effort)."""

    def __init__(self, rid: str) -> None:
        self.rid = rid
        self.sampling_params = None


def _reference(waiting: list[_Req], plan: FinalPlan) -> tuple[list[_Req], dict[str, bool]]:
    """Listed requests in the plan's order, unlisted ones after them in queue order (a rid
    listed twice or not waiting is skipped; a rid queued twice keeps its last request), then
    the same with the tier last; every waiting request's flag says whether it is in the tier."""
    by_rid = {r.rid: r for r in waiting}
    ranked = [by_rid.pop(rid) for rid in plan.order or () if rid in by_rid] + list(by_rid.values())
    if plan.order is None and not plan.best_effort:
        ranked = list(waiting)
    tier = plan.best_effort
    ranked = [r for r in ranked if r.rid not in tier] + [r for r in ranked if r.rid in tier]
    return ranked, {r.rid: r.rid in tier for r in waiting}


@pytest.mark.parametrize("seed", range(40))
def test_the_queue_and_the_tier_flags_are_the_per_request_ones(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(50):
        waiting = [_Req(f"r{rng.randrange(15)}") for _ in range(rng.randrange(12))]  # rids may repeat
        order = None if rng.random() < 0.2 else tuple(f"r{rng.randrange(18)}" for _ in range(rng.randrange(14)))
        plan = FinalPlan(order=order, best_effort=frozenset(f"r{rng.randrange(18)}" for _ in range(rng.randrange(6))))
        states = RequestStates()
        known = {f"r{i}" for i in range(18) if rng.random() < 0.8}
        for rid in sorted(known):
            states.of(_Stub(rid), 0.0)
        states.mark_tier(known, frozenset(rid for rid in sorted(known) if rng.random() < 0.5))
        before = {rid: states.is_declined(rid) for rid in known}
        queue = list(waiting)
        rids = [r.rid for r in waiting] if rng.random() < 0.5 else None  # the view builder's, if given
        perm = order_waiting(queue, plan, states, rids)

        expected, flags = _reference(waiting, plan)
        assert [id(r) for r in queue] == [id(r) for r in expected]
        moved = list(range(len(waiting))) if perm is None else perm  # what the view builder follows
        assert [id(waiting[i]) for i in moved] == [id(r) for r in queue]
        for rid in known:
            assert states.is_declined(rid) == flags.get(rid, before[rid])


@pytest.mark.parametrize("seed", range(20))
def test_a_plan_given_as_positions_moves_the_queue_as_its_rids_do(seed: int) -> None:
    """A policy that ranked positions (Tempo, GMAX) hands them over with its rids: the engine
    that made the view applies them without rid lookups, to the same queue and tier flags."""
    rng = random.Random(seed)
    for _ in range(50):
        waiting = [_Req(f"r{i}") for i in range(rng.randrange(1, 14))]
        n = len(waiting)
        listed = rng.sample(range(n), rng.randrange(n + 1))
        if rng.random() < 0.3:  # the queue already in the plan's order, or one swap away from it
            listed = list(range(n))
            if n > 1 and rng.random() < 0.5:
                i = rng.randrange(n - 1)
                listed[i], listed[i + 1] = listed[i + 1], listed[i]
        if listed and rng.random() < 0.3:  # listed twice: the rids decide, as without positions
            listed.insert(rng.randrange(len(listed) + 1), rng.choice(listed))
        tier_at = np.array(sorted(rng.sample(sorted(set(listed)), rng.randrange(len(set(listed)) + 1))), dtype=np.int64)
        order_at = np.array(listed, dtype=np.int64)
        tier = frozenset(waiting[i].rid for i in tier_at.tolist())
        by_rids = FinalPlan(order=tuple(waiting[i].rid for i in listed), best_effort=tier)
        by_positions = replace(by_rids, order_at=order_at, best_effort_at=tier_at)
        queues, flags = [], []
        for plan in (by_rids, by_positions):
            states = RequestStates()
            for r in waiting:
                states.of(_Stub(r.rid), 0.0)
            queue = list(waiting)
            order_waiting(queue, plan, states, [r.rid for r in waiting])
            queues.append([r.rid for r in queue])
            flags.append({r.rid: states.is_declined(r.rid) for r in waiting})
        assert queues[0] == queues[1] and flags[0] == flags[1]


@pytest.mark.parametrize("seed", range(20))
def test_held_requests_are_set_aside_by_position_as_by_rid(seed: int) -> None:
    """The adapter sets the plan's held requests aside before SGLang's admission walk: by the
    plan's positions, which the applied order puts at the queue's end, the same requests leave
    the queue in the same order as a rid lookup per request finds them."""
    rng = random.Random(seed)
    for _ in range(50):
        waiting = [_Req(f"r{i}") for i in range(rng.randrange(1, 14))]
        n = len(waiting)
        order_at = np.array(rng.sample(range(n), rng.randrange(n + 1)), dtype=np.int64)
        tier_at = np.array(sorted(rng.sample(range(n), rng.randrange(n + 1))), dtype=np.int64)
        hold_at = np.array(sorted(rng.sample(tier_at.tolist(), rng.randrange(len(tier_at) + 1))), dtype=np.int64)
        hold = frozenset(waiting[i].rid for i in hold_at.tolist())
        plan = FinalPlan(
            order=tuple(waiting[i].rid for i in order_at.tolist()),
            best_effort=frozenset(waiting[i].rid for i in tier_at.tolist()),
            hold=hold,
            order_at=order_at,
            best_effort_at=tier_at,
            hold_at=hold_at,
        )
        queue = list(waiting)
        perm = order_waiting(queue, plan, RequestStates(), [r.rid for r in waiting])
        by_rid = list(queue)
        aside_by_rid = set_aside(by_rid, hold)
        at = held_positions(plan, perm, n)
        assert at is not None
        k = len(hold_at)  # order_waiting put them last, so they leave as the queue's tail
        assert {r.rid for r in queue[n - k :]} == hold and at.tolist() == list(range(n - k, n))
        aside = set_aside(queue, hold, at)
        assert [r.rid for r in aside] == [r.rid for r in aside_by_rid] and queue == by_rid
