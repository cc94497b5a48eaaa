"""How the scheduler tells the HTTP edge that it shed a request: SGLang's abort finish reason,
with the shed's public reason, its Retry-After and predicted wait, and the request's class.

The HTTP edge turns it into a 429/503 with a Retry-After header (or, on a stream that already
started, leaves it as the abort finish reason); the router reads the same keys from its workers.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from scheduler.core.admission import retry_after_s, shed_reason
from scheduler.core.slo import SloSpec
from wire import PREDICTED_WAIT_KEY, QUEUE_FULL, RETRY_AFTER_KEY, SHED_CLASS_KEY, SHED_REASON_KEY


def shed_finish_reason(drop_reason: str, wait_s: float | None, slo: SloSpec | None) -> dict[str, Any]:
    """The abort finish reason of a shed request; `message` keeps the plan's drop reason (what
    clients matched on before the structured keys existed)."""
    reason = shed_reason(drop_reason)
    status = HTTPStatus.TOO_MANY_REQUESTS if reason == QUEUE_FULL else HTTPStatus.SERVICE_UNAVAILABLE
    return {
        "type": "abort",
        "status_code": status,
        "message": drop_reason,
        SHED_REASON_KEY: reason,
        RETRY_AFTER_KEY: retry_after_s(wait_s),
        PREDICTED_WAIT_KEY: None if wait_s is None else round(1000.0 * wait_s, 3),
        SHED_CLASS_KEY: (slo or SloSpec()).slo_class.value,
    }
