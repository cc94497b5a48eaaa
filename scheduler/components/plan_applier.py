"""Applying a finished plan's order and tiers to SGLang's waiting queue.

Reads `rid` from each waiting request; the queue is sorted in place (SGLang admits from its head).
"""

from __future__ import annotations

import logging
from typing import Any

from scheduler.components.request_state import RequestStates
from scheduler.core.plan_path import FinalPlan

logger = logging.getLogger("sglang_slo.scheduler")


def order_waiting(waiting: list[Any], plan: FinalPlan, states: RequestStates) -> None:
    """Admitted requests first in the policy's order (unlisted ones after them, in queue order);
    the best-effort tier runs on what is left of the step's budget (SLOs-Serve §4.1), so
    declined requests still run, last. Linear in the queue: no sort."""
    tier = plan.best_effort
    if plan.order is not None or tier:
        by_rid = {r.rid: r for r in waiting}
        ranked = [by_rid.pop(rid) for rid in plan.order or () if rid in by_rid]
        ranked += by_rid.values()  # unlisted, in queue order
        if tier:
            ranked = [r for r in ranked if r.rid not in tier] + [r for r in ranked if r.rid in tier]
        waiting[:] = ranked
    for r in waiting:  # the tier a request starts in is the one it runs in
        state = states.get(r.rid)
        if state is not None:
            state.declined = r.rid in tier
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
