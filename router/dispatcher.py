"""The router's asyncio core: place requests on workers, stream their tokens back, and keep every
stream whole when a worker dies, fails or is migrated away from. Independent of HTTP.

`Dispatcher` composes one object per job, each in its own module:
- router/flight_table.py: the requests in flight, and how one ends (exactly one final event);
- router/placement.py: choosing a worker and sending the Submit, and resubmitting after a loss;
- router/pd_pairing.py: what the policy sees in a PD pool, and the prefill partner of a pair;
- router/worker_inbox.py: the receive loop, which turns worker messages into stream events;
- router/reaper.py: a timer that fails over lost workers, times out silent requests and
  reconciles each worker's own list of what it holds (poison containment is there too);
- router/migration.py: a timer that executes the policy's migrations, and the operator's hook;
- router/outbox.py: sealed sends that report failure instead of raising.
All state lives on the event loop thread, so the only races are across `await`s; the one that
matters is closed by construction in `Placement.assign`. Router-made errors say why (`reason`:
no_worker, worker_failed, timeout, quarantined) and when to come back (`retry_after_s`, from the
workers' predicted queue drain).

Admission: with `max_queued` set, a new request finds the router's queue full when that many
requests are waiting for their first token, and is refused at once (429 queue_full) with a
Retry-After from the workers' own predicted queue drain.

Clocks: `clock` (default time.monotonic) is the router clock the registry and the policies read;
the bounded waits (admission, resume, inactivity) use the event loop's own clock, so they end
even under a frozen test clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Coroutine
from typing import Any

from router.dispatch_handle import DispatchHandle, DispatchLimits
from router.flight import Flight, NoWorkerAvailable, RequestStream, RouterQueueFull, StreamError
from router.flight_table import FlightTable
from router.handover import Decode
from router.membership import WorkerRegistry
from router.migration import Migrator
from router.outbox import WorkerOutbox
from router.pd import PREFILL, SPREAD
from router.pd_pairing import PdPairing
from router.placement import Placement
from router.policies.base import RoutingPolicy
from router.protocol import Abort, FetchReply, Submit
from router.reaper import Reaper
from router.routing_views import RouteRequest, RunningView
from router.transport import RouterEndpoint
from router.worker_auth import RouterAuth
from router.worker_inbox import WorkerInbox
from scheduler.core.admission import retry_after_s
from scheduler.core.shed_wire import Shed
from wire import QUEUE_FULL

logger = logging.getLogger(__name__)

ABORT_GRACE_S = 1.0  # at stop, how long workers get to read their Aborts before the socket closes
STATUS_OWNERS = 1000  # in-flight requests whose worker status() lists (for operators and tests)
# the event counters status() reports (and the router's metrics export as events_total{event=...})
STATUS_EVENTS = (
    "completed",
    "failed",
    "cancelled",
    "rejected",
    "resubmitted",
    "migrated",
    "migrations_skipped",
    "migrations_pinned",  # requests kept off the policy's migration checks: their output cannot move
    "migrations_refused",  # operator moves refused for that reason
    "restarted",  # constrained requests restarted from scratch after losing their worker
    "stopped_at_handover",  # stop strings the router matched across a hand-over
    "workers_lost",
    "late_chunks_dropped",
    "duplicate_tokens_trimmed",
    "pd_pairs",
    "pd_prefill_failed",
    "shed",
    "timed_out",
    "reconciled_lost",
    "orphans_aborted",
    "stale_aborts_sent",
    "foreign_dropped",
    "workers_stalled",
    "quarantined",  # requests that ran on a stalled engine: answered, never resubmitted
    "workers_forgotten",
)
NO_DRAIN_ESTIMATE_S = 1.0  # Retry-After when no worker has predicted its queue's drain yet
DEFAULT_MAX_QUEUED = 2048  # the router's queue bound by default (requests without a first token)
DEFAULT_REQUEST_TIMEOUT_S = 600.0  # a request's budget without progress, across its workers


class Dispatcher:
    """Routes requests with `policy` over the workers in `registry`, talking through `endpoint`.

    The caller owns the endpoint and closes it after `stop()`.
    """

    def __init__(
        self,
        endpoint: RouterEndpoint,
        policy: RoutingPolicy,
        registry: WorkerRegistry,
        clock: Callable[[], float] = time.monotonic,
        reap_interval_s: float = 0.25,
        migrate_interval_s: float | None = 0.1,  # None: never ask the policy for migrations
        admission_timeout_s: float = 2.0,  # a new request waits this long for a first worker
        resume_timeout_s: float = 10.0,  # a request whose worker died waits this long for another
        max_resubmits: int = 3,  # failovers + retries per request: a request that kills workers stops
        max_error_retries: int = 1,  # a worker's 5xx is retried this often elsewhere
        request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S,  # no progress this long, over all its workers: 504
        max_queued: int | None = DEFAULT_MAX_QUEUED,  # requests without a first token the router holds (None: no bound)
        reconcile_grace_s: float = 1.0,  # a placement this young may be missing from a load report
        auth: RouterAuth | None = None,  # the worker secret (None: workers are not authenticated)
        decode: Decode | None = None,  # the router's detokenizer: stop strings across a hand-over
        prefill_placement: str = SPREAD,  # PD: where prompts go on the prefill pool (router/pd.py)
    ) -> None:
        self.endpoint = endpoint
        self.policy = policy
        self.registry = registry
        self.clock = clock
        self.reap_interval_s = reap_interval_s
        self.migrate_interval_s = migrate_interval_s
        self.admission_timeout_s = admission_timeout_s
        self.max_queued = max_queued
        self.auth = auth if auth is not None else RouterAuth(None)
        self.abort_grace_s = ABORT_GRACE_S
        self.counters: Counter[str] = Counter()
        self.routed: Counter[str] = Counter()  # placements per worker, resumes included
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = False  # stop() ran: nothing new is admitted
        self.outbox = WorkerOutbox(endpoint, registry, self.auth, self.counters)
        limits = DispatchLimits(
            max_resubmits, max_error_retries, resume_timeout_s, request_timeout_s, reconcile_grace_s
        )
        handle = DispatchHandle(registry, policy, self.outbox, self.auth, clock, self.counters, self.routed, limits)
        self.pairing = PdPairing(handle, prefill_placement)
        self.prefill_chooser = self.pairing.chooser
        self.table = FlightTable(handle, self.pairing)
        self.placement = Placement(handle, self.table, self.pairing, decode)
        self.reaper = Reaper(handle, self.table, self.placement)
        self.inbox = WorkerInbox(handle, endpoint, self.table, self.placement, self.reaper)
        self.migrator = Migrator(handle, self.table, self.placement, decode is not None)

    # --- lifecycle ---

    async def start(self) -> None:
        if self._tasks:
            raise RuntimeError("dispatcher already started")
        self._tasks = [asyncio.create_task(self.inbox.receive_loop(), name="dispatcher-recv")]
        reap = self._every(self.reap_interval_s, self.reaper.reap)
        self._tasks.append(asyncio.create_task(reap, name="dispatcher-reap"))
        if self.migrate_interval_s is not None:
            migrate = self._every(self.migrate_interval_s, self.migrator.tick)
            self._tasks.append(asyncio.create_task(migrate, name="dispatcher-migrate"))

    async def stop(self) -> None:
        """Stop the loops, end every open stream with a 503 and abort its worker (best effort)."""
        self._stopped = True
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        aborted = False
        for flight in list(self.table.flights.values()):
            owner = flight.owner
            self.table.finish(flight, StreamError(flight.route.rid, 503, "router shutting down"), "failed")
            if owner is not None:
                aborted = await self.outbox.send(owner, Abort(rid=flight.route.rid)) or aborted
        if aborted:  # a worker loses what it has not read yet once the router's socket closes
            await asyncio.sleep(self.abort_grace_s)
        await self.outbox.close()

    async def _every(self, interval_s: float, tick: Callable[[], Coroutine[Any, Any, None]]) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await tick()
            except Exception:  # noqa: BLE001 - a failing tick must not stop the timer
                logger.exception("dispatcher timer %s failed", getattr(tick, "__name__", tick))

    # --- the client side ---

    async def submit(self, route: RouteRequest, submit: Submit) -> RequestStream:
        """Place the request and return its stream; NoWorkerAvailable after the admission timeout."""
        rid = route.rid
        if submit.rid != rid:
            raise ValueError(f"route rid {rid!r} != submit rid {submit.rid!r}")
        if submit.resume_output_ids:
            raise ValueError("resume_output_ids are the dispatcher's to set")
        if rid in self.table.flights:
            raise ValueError(f"request {rid!r} is already in flight")
        if self._stopped:
            raise NoWorkerAvailable("the router is shutting down")
        if self.max_queued is not None and self.queued() >= self.max_queued:
            self.counters["shed"] += 1
            raise RouterQueueFull(self.queue_full_shed(route))
        flight = Flight(route=route, submit=submit)
        self.table.add(flight)
        loop = asyncio.get_running_loop()
        flight.progress_at = loop.time()
        deadline = loop.time() + self.admission_timeout_s
        try:
            while not await self.placement.place(flight):
                remaining = deadline - loop.time()
                if remaining <= 0:
                    self.counters["rejected"] += 1
                    raise NoWorkerAvailable(
                        f"no healthy worker to route {rid!r} to within {self.admission_timeout_s:g} s"
                    )
                try:
                    await asyncio.wait_for(self.inbox.registered.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        except BaseException:
            self.table.cancel(flight, count=False)
            raise
        return RequestStream(flight, self.table.cancel)

    def queued(self) -> int:
        """Requests the router holds that have no first token yet."""
        return len(self.table.unstarted)

    def queue_full_shed(self, route: RouteRequest) -> Shed:
        """The 429 for a full router queue: come back when the soonest worker's queue has drained
        (its own prediction), else its measured queueing delay."""
        views = [v for v in self.registry.views(self.clock()) if v.healthy and v.role != PREFILL]
        drains = [v.queue_drain_s for v in views if v.queue_drain_s is not None]
        wait = min(drains) if drains else min((v.queue_delay_s for v in views), default=NO_DRAIN_ESTIMATE_S)
        return Shed(
            QUEUE_FULL,
            retry_after_s(wait),
            round(1000.0 * wait, 3) if math.isfinite(wait) else None,
            route.slo.slo_class.value,
            code="router_queue_full",
        )

    def status(self) -> dict[str, Any]:
        """Counters for /slo/status: what was routed where, what moved, what failed, decision cost."""
        window = sorted(self.placement.decision_ns)
        flights = self.table.flights

        def pct(q: float) -> int | None:
            return window[min(len(window) - 1, int(q * len(window)))] if window else None

        return {
            "inflight": len(flights),
            "queued": self.queued(),
            "max_queued": self.max_queued,
            "waiting_for_worker": len(self.table.waiting),
            "owners": {
                rid: f.owner for rid, f in itertools.islice(flights.items(), STATUS_OWNERS) if f.owner is not None
            },
            "routed": dict(self.routed),
            "prefill_partners": {
                rid: f.prefill for rid, f in itertools.islice(flights.items(), STATUS_OWNERS) if f.prefill is not None
            },
            **{name: self.counters[name] for name in STATUS_EVENTS},
            "decision_ns": {
                "count": self.counters["decisions"],
                "window": len(window),
                "p50": pct(0.5),
                "p99": pct(0.99),
                "max": window[-1] if window else None,
            },
        }

    def running_on(self, worker_id: str) -> list[RunningView]:
        """The requests the router has in flight on `worker_id` (SLOs-Serve's replica state)."""
        return [
            RunningView(f.route, worker_id, len(f.delivered), f.first_token_s)
            for f in self.table.flights.values()
            if f.owner == worker_id and not f.done
        ]

    # --- operator hooks ---

    async def fetch(self, worker_id: str, method: str, path: str, timeout_s: float) -> FetchReply:
        """The worker's own HTTP answer to `method path`, asked over the worker link; TimeoutError
        when it does not answer in time, ConnectionError when it cannot be reached."""
        return await self.inbox.fetch(worker_id, method, path, timeout_s)

    async def migrate(self, rid: str, target: str) -> bool:
        """Move a running request to `target` now; False when it was skipped, MigrationRefused
        when its output cannot be carried over."""
        return await self.migrator.migrate(rid, target)
