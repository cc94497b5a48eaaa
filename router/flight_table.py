"""The requests the router has in flight, and how one ends.

Every other part of the dispatcher reads and changes flights through this table, so "the request
is over" means one thing everywhere: its owner and prefill partner are released, any worker
still holding a copy is owed an Abort, and its client gets exactly one final event.
"""

from __future__ import annotations

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import Flight, StreamError, StreamEvent
from router.pd import PREFILL
from router.pd_pairing import PdPairing
from router.protocol import Abort
from scheduler.core.admission import retry_after_s

NO_WORKER_RETRY_S = 5  # Retry-After with no healthy worker: a worker joins or comes back in seconds


class FlightTable(DispatchPart):
    """Flights by request id, the ones still waiting for a first token or for a worker, and the
    ones that just ended (a worker's load report may still list them)."""

    def __init__(self, handle: DispatchHandle, pairing: PdPairing) -> None:
        super().__init__(handle)
        self.pairing = pairing
        self.flights: dict[str, Flight] = {}
        self.unstarted: set[str] = set()  # rids in flight with no first token yet
        self.recently_ended: dict[str, float] = {}  # rid -> router clock it ended
        self.waiting: dict[str, Flight] = {}  # lost their worker, none to go to yet

    def add(self, flight: Flight) -> None:
        """Before its Submit goes out, so that its first chunk finds it."""
        self.flights[flight.route.rid] = flight
        self.unstarted.add(flight.route.rid)

    def owned(self, rid: str, worker_id: str) -> Flight | None:
        """The request if `worker_id` currently owns it; late messages from old owners are dropped."""
        flight = self.flights.get(rid)
        if flight is None or flight.owner != worker_id:
            self.counters["late_chunks_dropped"] += 1
            return None
        return flight

    def release(self, flight: Flight) -> str | None:
        """Detach the request from its owner (whose later chunks are then ignored) and from its
        prefill partner, which is told to stop: a new placement gets a new pair."""
        owner = flight.owner
        flight.owner = None
        self.registry.untrack(flight.route.rid)
        if owner is not None:
            self.policy.on_finished(flight.route.rid, owner)
        self.pairing.drop(flight, abort=True)
        return owner

    async def flush_aborts(self, flight: Flight) -> None:
        stale, flight.stale = flight.stale, []
        for worker_id in stale:
            await self.outbox.abort_stale(worker_id, flight.route.rid)

    def _end(self, flight: Flight) -> str | None:
        flight.done = True
        self.unstarted.discard(flight.route.rid)
        self.recently_ended[flight.route.rid] = self.clock()
        owner = self.release(flight)
        if flight.stale:
            self.outbox.spawn(self.flush_aborts(flight))
        self.flights.pop(flight.route.rid, None)
        self.waiting.pop(flight.route.rid, None)
        return owner

    def finish(self, flight: Flight, event: StreamEvent, outcome: str) -> None:
        """End the request with `event` as its client's last, counted as `outcome`."""
        self._end(flight)
        flight.queue.put_nowait(event)
        self.counters[outcome] += 1

    def cancel(self, flight: Flight, count: bool = True) -> None:
        """The client went away: forget the request and abort it on its worker (in the background)."""
        if flight.done:
            return
        owner = self._end(flight)
        if count:
            self.counters["cancelled"] += 1
        if owner is not None:
            self.outbox.spawn(self.outbox.send(owner, Abort(rid=flight.route.rid)))

    def forget_ended(self, now: float, grace_s: float) -> None:
        """Forget requests that ended `grace_s` ago: a report listing them now is about a copy."""
        for rid in [rid for rid, t in self.recently_ended.items() if now - t >= grace_s]:
            del self.recently_ended[rid]

    def router_error(
        self, rid: str, status: int, message: str, reason: str, worker_id: str | None = None
    ) -> StreamError:
        """An error the router decided, with its reason and when to come back."""
        return StreamError(rid, status, message, worker_id, reason=reason, retry_after_s=self.retry_after_s())

    def retry_after_s(self) -> int:
        """Retry-After for a router-made error: the soonest healthy worker's predicted queue
        drain; NO_WORKER_RETRY_S when no worker is healthy."""
        views = [v for v in self.registry.views(self.clock()) if v.healthy and v.role != PREFILL]
        if not views:
            return NO_WORKER_RETRY_S
        drains = [v.queue_drain_s for v in views if v.queue_drain_s is not None]
        return retry_after_s(min(drains) if drains else min(v.queue_delay_s for v in views))
