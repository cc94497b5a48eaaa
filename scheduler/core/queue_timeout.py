"""max_queue_ms admission: a request not started in time finishes with a clear reason."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler.core.types import RequestView

QUEUE_TIMEOUT_REASON = "slo_queue_timeout"


def expired_in_queue(waiting: Iterable[RequestView], now: float) -> list[str]:
    """Waiting requests whose max_queue_ms has passed before they started."""
    return [
        r.rid
        for r in waiting
        if r.slo.max_queue_ms is not None and not r.started and now - r.arrival > r.slo.max_queue_ms / 1000.0
    ]
