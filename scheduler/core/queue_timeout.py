"""max_queue_ms admission: a request not started in time finishes with a clear reason."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.types import RequestView

QUEUE_TIMEOUT_REASON = "slo_queue_timeout"


def expired_waiting(c: ViewColumns, now: float) -> np.ndarray:
    """Per waiting request: its max_queue_ms has passed before it started."""
    nw = c.n_waiting
    return ~c.started[:nw] & (now - c.arrival[:nw] > c.max_queue_s[:nw])  # nan (no max_queue): never


def expired_rids(c: ViewColumns, now: float) -> list[str]:
    """The waiting rids `expired_waiting`, in queue order."""
    if np.isnan(c.max_queue_s[: c.n_waiting]).all():
        return []  # nobody set one: no per-pass column need be read
    rids = c.rids
    return [rids[i] for i in expired_waiting(c, now).nonzero()[0].tolist()]


def expired_in_queue(waiting: Iterable[RequestView], now: float) -> list[str]:
    """Waiting requests whose max_queue_ms has passed before they started (`expired_rids` on
    the views themselves: cheaper when no columns were read)."""
    return [
        r.rid
        for r in waiting
        if r.slo.max_queue_ms is not None and not r.started and now - r.arrival > r.slo.max_queue_ms / 1000.0
    ]
