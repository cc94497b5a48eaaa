"""Applying a finished plan's order and tiers to SGLang's waiting queue.

Reads `rid` from each waiting request; the queue is sorted in place (SGLang admits from its head).
"""

from __future__ import annotations

import logging
from itertools import repeat
from typing import Any

from scheduler.components.request_state import RequestStates
from scheduler.core.plan_path import FinalPlan

logger = logging.getLogger("sglang_slo.scheduler")


def order_waiting(waiting: list[Any], plan: FinalPlan, states: RequestStates) -> None:
    """Admitted requests first in the policy's order (unlisted ones after them, in queue order);
    the best-effort tier runs on what is left of the step's budget (SLOs-Serve §4.1), so
    declined requests still run, last. Linear in the queue, no sort; the tier is split on the
    plan's rids, so each request is looked at once."""
    tier = plan.best_effort
    rids = [r.rid for r in waiting]
    if plan.order is not None or tier:
        by_rid = dict(zip(rids, waiting))
        order = plan.order or ()
        listed, listed_tier = order, ()
        if tier:
            listed, listed_tier = [rid for rid in order if rid not in tier], [rid for rid in order if rid in tier]
        pop = by_rid.pop  # a rid listed twice, or not waiting, is skipped
        head = [r for r in map(pop, listed, repeat(None)) if r is not None]
        tail = [r for r in map(pop, listed_tier, repeat(None)) if r is not None]
        for r in by_rid.values():  # unlisted, in queue order, each on its side of the tier
            (tail if tier and r.rid in tier else head).append(r)
        waiting[:] = head + tail
    states.mark_tier(rids, tier)  # the tier a request starts in is the one it runs in
    if logger.isEnabledFor(logging.DEBUG) and waiting:
        logger.debug("order: %s; best-effort tier: %s", [r.rid for r in waiting[:8]], sorted(tier)[:8])


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
