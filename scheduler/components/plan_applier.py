"""Applying a finished plan's order and tiers to SGLang's waiting queue.

Reads `rid` from each waiting request; the queue is sorted in place (SGLang admits from its head).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Set
from itertools import compress, filterfalse, repeat
from typing import Any

import numpy as np

from scheduler.components.request_state import RequestStates
from scheduler.core.plan_path import FinalPlan

logger = logging.getLogger("sglang_slo.scheduler")


def order_waiting(
    waiting: list[Any], plan: FinalPlan, states: RequestStates, rids: list[str] | None = None
) -> np.ndarray | None:
    """Admitted requests first in the policy's order (unlisted ones after them, in queue order);
    the best-effort tier runs on what is left of the step's budget (SLOs-Serve §4.1), so
    declined requests still run, last. Linear in the queue, no sort: the order is split on the
    plan's rids and mapped to positions in C loops. `rids`: the queue's rids when the caller
    has them already (the view builder does); with them and the plan's positions, its held
    requests (`hold_at`, all in the tier) go to the very end, where `set_aside` takes them as
    one slice. Returns the permutation applied (the request now at i was at perm[i]), None
    where the queue was left as it was."""
    tier = plan.best_effort
    if plan.order is None and not tier:  # nothing to reorder (stock fcfs): only a stale tier to clear
        if states.declined:
            states.mark_tier(rids if rids is not None else [r.rid for r in waiting], tier)
        return None
    if rids is not None and plan.order_at is not None and (plan.best_effort_at is not None or not tier):
        ranked = _positions(plan.order_at, plan.best_effort_at, len(waiting), plan.hold_at)
        if ranked is not None:
            if not _in_place(ranked):  # a queue already in the plan's order (the usual pass) stays as it is
                waiting[:] = list(map(waiting.__getitem__, ranked.tolist()))
            if (
                plan.tier_flips_at is not None
                and plan.best_effort_class_at is not None
                and plan.best_effort_at is not None
            ):
                states.mark_tier_at(rids, plan.best_effort_at, plan.tier_flips_at, plan.best_effort_class_at)
            else:
                states.mark_tier(rids, tier)
            return ranked
    if rids is None:
        rids = [r.rid for r in waiting]
    index = dict(zip(rids, range(len(rids))))  # a rid queued twice keeps its last request
    order = plan.order or ()
    listed, listed_tier = (
        (list(filterfalse(tier.__contains__, order)), list(filter(tier.__contains__, order))) if tier else (order, ())
    )
    by_rid = index.copy()
    try:  # the plan lists each waiting rid once, as finish_plan leaves it
        head, tail = list(map(by_rid.pop, listed)), list(map(by_rid.pop, listed_tier))
    except KeyError:  # a rid listed twice, or not waiting: skipped
        by_rid = index.copy()
        head, tail = _take(by_rid, listed), _take(by_rid, listed_tier)
    for rid, at in by_rid.items():  # unlisted, in queue order, each on its side of the tier
        (tail if rid in tier else head).append(at)
    perm = head + tail
    waiting[:] = list(map(waiting.__getitem__, perm))
    states.mark_tier(index.keys(), tier)  # the tier a request starts in is the one it runs in
    if logger.isEnabledFor(logging.DEBUG) and waiting:
        logger.debug("order: %s; best-effort tier: %s", [r.rid for r in waiting[:8]], sorted(tier)[:8])
    return np.array(perm, dtype=np.int64)


def _positions(order: np.ndarray, tier: np.ndarray | None, n: int, hold: np.ndarray | None = None) -> np.ndarray | None:
    """order_waiting's permutation from the plan's positions: the listed ones, then the rest in
    queue order, the tier's after everything else, and the held ones (a part of the tier) at
    the very end. None when a position is listed twice (the rids then say which listing counts)."""
    listed = np.zeros(n, dtype=bool)
    listed[order] = True
    if np.count_nonzero(listed) != len(order):
        return None
    ranked = np.concatenate([order, (~listed).nonzero()[0]]) if len(order) < n else order
    for last_ones in (tier, hold):
        if last_ones is not None and len(last_ones):
            at_end = np.zeros(n, dtype=bool)
            at_end[last_ones] = True
            last = at_end[ranked]
            ranked = np.concatenate([ranked[~last], ranked[last]])
    return ranked


def _in_place(perm: np.ndarray) -> bool:
    """Whether `perm` leaves every request where it is: one comparison in C, where moving the
    queue's requests is a Python step each."""
    return bool(perm.size == 0 or (perm[0] == 0 and (perm[1:] - perm[:-1] == 1).all()))


def held_positions(plan: FinalPlan, perm: np.ndarray | None, n: int) -> np.ndarray | None:
    """Where the plan's held requests stand (ascending) in the queue `order_waiting` left by
    `perm`, when the plan gave them as positions; None: they are found by rid."""
    if plan.hold_at is None or perm is None or len(perm) != n:
        return None
    k = len(plan.hold_at)
    if k and np.array_equal(np.sort(perm[n - k :]), plan.hold_at):
        return np.arange(n - k, n)  # the queue's tail, where order_waiting put them
    moved_to = np.empty(n, dtype=np.int64)
    moved_to[perm] = np.arange(n)
    return np.sort(moved_to[plan.hold_at])


def set_aside(queue: list[Any], hold: Set[str], at: np.ndarray | None = None) -> list[Any]:
    """Takes the held requests out of `queue` (in place) and returns them, in queue order.
    `at`: their positions (`held_positions`), which spares a rid lookup per waiting request."""
    if at is not None and len(at) and at[0] == len(queue) - len(at):  # ascending: the tail
        held = queue[at[0] :]
        del queue[at[0] :]
        return held
    if at is not None:
        keep = np.ones(len(queue), dtype=bool)
        keep[at] = False
        held = list(map(queue.__getitem__, at.tolist()))
        queue[:] = list(compress(queue, keep.tolist()))
        return held
    held = [r for r in queue if r.rid in hold]
    queue[:] = [r for r in queue if r.rid not in hold]
    return held


def _take(by_rid: dict[str, int], rids: Iterable[str]) -> list[int]:
    """by_rid's positions for `rids`, in order, each taken out; a rid no longer there is skipped."""
    return [at for at in map(by_rid.pop, rids, repeat(None)) if at is not None]


def split_dropped(waiting: list[Any], drop: dict[str, str]) -> tuple[list[Any], list[tuple[Any, str]]]:
    """(requests kept in order, (request, reason) for each dropped one)."""
    if not drop:
        return waiting, []
    keep, dropped = [], []
    for req in waiting:
        reason = drop.get(req.rid)
        if reason is None:
            keep.append(req)
        else:
            dropped.append((req, reason))
    return keep, dropped
