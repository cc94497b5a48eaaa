"""How the scheduler tells the HTTP edge that it shed a request: SGLang's abort finish reason,
with the shed's public reason, its Retry-After and predicted wait, and the request's class.

The HTTP edge turns it into a 429/503 with a Retry-After header (or, on a stream that already
started, leaves it as the abort finish reason); the router reads the same keys from its workers.
"""

from __future__ import annotations

from typing import Any

from scheduler.core.admission import retry_after_s, shed_reason
from scheduler.core.shed_wire import Shed
from scheduler.core.slo import SloSpec


def shed_finish_reason(drop_reason: str, wait_s: float | None, slo: SloSpec | None) -> dict[str, Any]:
    """The abort finish reason of a shed request; its `message` starts with the plan's drop
    reason (what clients matched on before the structured keys existed)."""
    shed = Shed(
        reason=shed_reason(drop_reason),
        retry_after_s=retry_after_s(wait_s),
        predicted_wait_ms=None if wait_s is None else round(1000.0 * wait_s, 3),
        slo_class=(slo or SloSpec()).slo_class.value,
        code=drop_reason,
    )
    return shed.finish_reason()
