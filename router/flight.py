"""One client request across the workers it runs on (`Flight`), and what its client reads
(`RequestStream` and its events).

A flight outlives any one placement: its owner changes when its worker dies, fails or is migrated
away from, while its client keeps reading one stream. The client's `StreamChunk.completion_tokens`
is always the number of tokens it has received, whatever a worker says.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from router.handover import StopWatch
from router.policies.base import NoWorkerError
from router.protocol import Submit
from router.routing_views import RouteRequest
from scheduler.core.shed_wire import Shed

# Why the router itself ended a request (the error's `reason`).
NO_WORKER, WORKER_FAILED, TIMED_OUT, QUARANTINED = "no_worker", "worker_failed", "timeout", "quarantined"


class NoWorkerAvailable(NoWorkerError):
    """No healthy worker within the admission timeout; the HTTP layer answers 503."""


class RouterQueueFull(RuntimeError):
    """The router's queue is at `max_queued`; the HTTP layer answers with the shed (429)."""

    def __init__(self, shed: Shed) -> None:
        super().__init__(shed.message)
        self.shed = shed


@dataclass(frozen=True)
class StreamChunk:
    """New tokens for the client; `completion_tokens` counts every token it has received so far."""

    rid: str
    token_ids: tuple[int, ...]
    completion_tokens: int
    worker_id: str | None  # the worker that generated them; None for a router-made final chunk
    text: str | None = None
    finish_reason: str | None = None
    meta: dict[str, Any] | None = None
    restart: bool = False  # the request starts over (not streamed): every earlier token is void


@dataclass(frozen=True)
class StreamError:
    """The request ended in error: a worker's 4xx passed through, or the router gave up (5xx)."""

    rid: str
    status: int
    message: str
    worker_id: str | None = None  # None when the router itself ended the request
    shed: Shed | None = None  # a worker shed it: the answer carries its reason and Retry-After
    reason: str | None = None  # why the router ended it (NO_WORKER, ...); None for a worker's own error
    retry_after_s: int | None = None  # when to come back, with a reason


StreamEvent = StreamChunk | StreamError


@dataclass(eq=False)
class Flight:
    """One client request across all the workers it runs on."""

    route: RouteRequest
    submit: Submit
    queue: asyncio.Queue[StreamEvent] = field(default_factory=asyncio.Queue)
    owner: str | None = None  # the only worker whose chunks count
    delivered: list[int] = field(default_factory=list)  # token ids the client has been given
    hops: list[str] = field(default_factory=list)  # every worker it was placed on, in order
    resubmits: int = 0  # failovers and 5xx retries so far
    error_retries: int = 0
    first_token_s: float | None = None
    waiting_since: float | None = None  # loop time it lost its worker with none to go to
    done: bool = False
    prefill: str | None = None  # PD: the prefill worker of the current pair, until it answers
    prefill_hops: list[str] = field(default_factory=list)  # every prefill worker it was paired with
    # Workers owed an Abort for an old placement. Sent (awaited) before the next Submit, because
    # the same worker may be chosen again and an Abort arriving after its new Submit would kill it.
    stale: list[str] = field(default_factory=list)
    placed_s: float = 0.0  # router clock when its current owner got it (reconciliation's grace)
    active_at: float = 0.0  # loop time of its last placement or chunk (the inactivity timeout)
    progress_at: float = 0.0  # loop time of its submission or last token: its budget counts from here
    placed_delivered: int = 0  # tokens delivered when its current owner got it (did it run there?)
    strikes: int = 0  # stalled engines it was on, and dead workers it was running on
    watch: StopWatch | None = None  # stop strings matched across its last hand-over
    pinned: bool = False  # counted once in migrations_pinned


class RequestStream:
    """What `Dispatcher.submit` returns: an async iterator of the request's events.

    The last event is a StreamChunk with `finish_reason` or a StreamError. A consumer that stops
    early must call `aclose()` (or use `async with`); cancelling a task blocked in `__anext__`
    (an HTTP client disconnect) aborts the request too.
    """

    def __init__(self, flight: Flight, cancel: Callable[[Flight], None]) -> None:
        self._flight = flight
        self._cancel = cancel  # forgets the request and aborts it on its worker
        self._ended = False

    @property
    def rid(self) -> str:
        return self._flight.route.rid

    @property
    def workers(self) -> tuple[str, ...]:
        """Every worker the request was placed on, in order (for reports and debugging)."""
        return tuple(self._flight.hops)

    @property
    def prefill_workers(self) -> tuple[str, ...]:
        """PD: every prefill worker the request was paired with, in order."""
        return tuple(self._flight.prefill_hops)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> StreamEvent:
        if self._ended:
            raise StopAsyncIteration
        try:
            event = await self._flight.queue.get()
        except asyncio.CancelledError:
            self._ended = True
            self._cancel(self._flight)
            raise
        if isinstance(event, StreamError) or event.finish_reason is not None:
            self._ended = True
        return event

    async def aclose(self) -> None:
        """Abort the request on its worker unless it already ended; idempotent."""
        self._ended = True
        self._cancel(self._flight)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
