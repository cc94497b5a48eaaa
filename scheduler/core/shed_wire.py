"""A shed request's wire form, the same at every HTTP edge (worker and router) and on every
route: HTTP 429 (queue full) or 503, a `Retry-After` header in whole seconds, and an
OpenAI-shaped error object whose extra keys say why (`reason`), how long the server predicts
the wait (`predicted_wait_ms`) and the request's class."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from wire import (
    PREDICTED_WAIT_KEY,
    QUEUE_FULL,
    RETRY_AFTER_HEADER,
    RETRY_AFTER_KEY,
    SHED_CLASS_KEY,
    SHED_REASON_KEY,
    SHED_REASONS,
)


@dataclass(frozen=True)
class Shed:
    reason: str  # one of wire.SHED_REASONS
    retry_after_s: int
    predicted_wait_ms: float | None = None
    slo_class: str | None = None
    code: str | None = None  # the engine's own name for it, when it has one (slo_queue_timeout)

    @property
    def status(self) -> int:
        return 429 if self.reason == QUEUE_FULL else 503

    def headers(self) -> dict[str, str]:
        return {RETRY_AFTER_HEADER: str(self.retry_after_s)}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": "rate_limit_error" if self.status == 429 else "service_unavailable",
                "param": None,
                "code": self.status,
                SHED_REASON_KEY: self.reason,
                RETRY_AFTER_KEY: self.retry_after_s,
                PREDICTED_WAIT_KEY: self.predicted_wait_ms,
                SHED_CLASS_KEY: self.slo_class,
            }
        }

    def finish_reason(self) -> dict[str, Any]:
        """The abort finish reason a stream that already started ends with; its message is the
        engine's short code, as SGLang's own aborts carry."""
        return {
            "type": "abort",
            "status_code": self.status,
            "message": self.code or self.reason,
            **self.fields(),
        }

    @property
    def message(self) -> str:
        text = _MESSAGES[self.reason]
        return f"{self.code}: {text}" if self.code and self.code != self.reason else text

    def fields(self) -> dict[str, Any]:
        return {
            SHED_REASON_KEY: self.reason,
            RETRY_AFTER_KEY: self.retry_after_s,
            PREDICTED_WAIT_KEY: self.predicted_wait_ms,
            SHED_CLASS_KEY: self.slo_class,
        }


_MESSAGES = {
    "queue_full": "the server's queue is full: retry after the Retry-After delay",
    "slo_infeasible": "the request's SLO cannot be met with the work ahead of it (on_infeasible: reject)",
    "queue_timeout": "the request was not started within its max_queue_ms",
    "draining": "the server is shutting down and admits no new request",
}


def shed_from(fields: Mapping[str, Any] | None) -> Shed | None:
    """The Shed an abort finish reason or an error object describes (None: not a shed)."""
    if not isinstance(fields, Mapping) or fields.get(SHED_REASON_KEY) not in SHED_REASONS:
        return None
    retry = _number(fields.get(RETRY_AFTER_KEY))
    cls = fields.get(SHED_CLASS_KEY)
    return Shed(
        reason=str(fields[SHED_REASON_KEY]),
        retry_after_s=1 if retry is None else max(1, math.ceil(retry)),
        predicted_wait_ms=_number(fields.get(PREDICTED_WAIT_KEY)),
        slo_class=cls if isinstance(cls, str) else None,
    )


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None
