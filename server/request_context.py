"""What the HTTP edge and SGLang's tokenizer manager share about one request while it is served:
whether it came through this worker's router agent (checked by the middleware), the SLO the
middleware parsed (so it is parsed once in this process), and whether the scheduler shed it
(noted by the tokenizer manager, answered by the middleware with the shed's status, Retry-After
and body).

A context variable set by the ASGI middleware before it calls SGLang's app: the route handler,
the tokenizer manager's generator and the response's streaming task all run in that context (or
a copy of it), and they share the one mutable object it holds.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from scheduler.core.shed_wire import Shed
from scheduler.core.slo import SloSpec


@dataclass
class RequestContext:
    from_agent: bool = False  # the router's agent sent it (verified token): stream deltas, trust its stamps
    shed: Shed | None = None  # set when the scheduler shed the request
    slo_clamped: dict[str, Any] | None = None  # what the caller's key limits changed (its SLO report says so)
    # The SLO and arrival the middleware validated and injected: the tokenizer manager reads
    # them here instead of parsing the injected copy again (None: the middleware set none)
    slo: SloSpec | None = None
    arrival: float | None = None


_CURRENT: ContextVar[RequestContext | None] = ContextVar("sglang_slo_request", default=None)


def begin() -> RequestContext:
    """A fresh context for the request being handled now."""
    ctx = RequestContext()
    _CURRENT.set(ctx)
    return ctx


def current() -> RequestContext | None:
    return _CURRENT.get()
