"""Every request gets an answer: the dispatcher's timer that finds requests nothing will answer.

A request with no event from its worker for a share of `request_timeout_s` is resubmitted
elsewhere (or answered 504); each worker's load report lists the requests it holds, and one the
router placed there over `reconcile_grace_s` ago that is missing was lost (a lost Submit, or a
lost final message): it is resubmitted from the tokens delivered, while one the worker holds that
the router does not own is aborted there.

One budget per request: `request_timeout_s` counts from the request's last progress (its
submission, or the last token delivered), across every worker it is moved to, so a request
waits at most that long for a 504, however often it moves. A placement silent for a share of it
(`request_timeout_s / (max_resubmits + 1)`) is moved on before the budget is spent.

Poison containment. When a worker's engine stalls, the requests it was running are suspects: the
stall is something the engine did while stepping them (a stop pattern that backtracks without end,
an input that hangs a kernel), and the router cannot tell which of the running batch did it.
Resubmitting them would let the culprit stall the next worker, and the next, up to
`max_resubmits` times; so each request that ran on the stalled worker (it received a token from
it) is quarantined: answered 503 `quarantined`, never placed again. The innocent ones of that
batch pay one retry, which their clients do with a fresh request on a healthy worker. Requests
only queued there (no token from it) did not run and move on. Two strikes end any request: a
request on two stalled engines (queued or not), or running on two workers that died, or one of
each, is quarantined too, as it is then the likeliest culprit (one that stalls an engine before
its first token reaches the router, e.g. in prefill, or that crashes its worker); two unrelated
failures under one request are rare, and its client can still retry. Either way a poison request
hangs or kills at most two workers, not `max_resubmits + 1`.
"""

from __future__ import annotations

import asyncio
import logging

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import QUARANTINED, TIMED_OUT, Flight
from router.flight_table import FlightTable
from router.placement import Placement
from router.protocol import Abort

logger = logging.getLogger(__name__)

QUARANTINE_STRIKES = 2  # stalled engines it was on, or dead workers it ran on: then it is quarantined


class Reaper(DispatchPart):
    """Fails over the requests of lost workers, times out silent requests, and reconciles the
    router's books with each worker's own list of what it holds."""

    def __init__(self, handle: DispatchHandle, table: FlightTable, placement: Placement) -> None:
        super().__init__(handle)
        self.table = table
        self.placement = placement

    async def reap(self) -> None:
        """Fail over the requests of workers that went silent (or whose engine stalled), end or
        move requests nothing was heard of for too long, forget long-dead workers, then retry
        the waiting ones."""
        now = self.clock()
        flights = self.table.flights
        for worker_id in self.registry.reap(now):
            stalled = self.registry.is_stalled(worker_id)
            self.counters["workers_stalled" if stalled else "workers_lost"] += 1
            lost = self.registry.inflight_on(worker_id)
            why = "engine stopped stepping" if stalled else "is silent"
            logger.warning("worker %s %s: resubmitting %d requests", worker_id, why, len(lost))
            for rid in lost:
                flight = flights.get(rid)
                if flight is None or flight.owner != worker_id:
                    self.registry.untrack(rid)
                    continue
                self.table.release(flight)
                self.outbox.spawn(self.outbox.abort_stale(worker_id, rid))  # if it wakes up, it should stop
                if self._quarantine(flight, worker_id, stalled):
                    continue
                await self.placement.resubmit(flight, worker_id, f"worker {worker_id} {why}")
            for flight in [f for f in flights.values() if f.prefill == worker_id and not f.done]:
                await self.placement.prefill_failed(flight, 502, f"prefill worker {worker_id} {why}")
        await self._expire_inactive()
        self.table.forget_ended(now, self.limits.reconcile_grace_s)
        for worker_id in self.registry.forget_dead(now):
            self.counters["workers_forgotten"] += 1
            self.routed.pop(worker_id, None)
            self.auth.forget(worker_id)
            self.policy.forget_worker(worker_id)
        if self.table.waiting:
            await self.placement.retry_waiting()

    def _quarantine(self, flight: Flight, worker_id: str, stalled: bool) -> bool:
        """End a request taken off a stalled or dead worker if it is a suspect (see the module
        doc): it ran on a stalled engine, or this is its QUARANTINE_STRIKES-th strike (a stalled
        engine it was on, a dead worker it ran on). False: it may move on."""
        ran_here = len(flight.delivered) > flight.placed_delivered
        if stalled or ran_here:
            flight.strikes += 1
        if not (stalled and ran_here) and flight.strikes < QUARANTINE_STRIKES:
            return False
        rid = flight.route.rid
        event = f"worker {worker_id}'s engine stopped stepping" if stalled else f"worker {worker_id} died"
        why = "was running" if stalled and ran_here else f"was on {flight.strikes} workers that stalled or died"
        msg = f"quarantined: it {why} when {event}; not retried elsewhere"
        logger.warning("request %s %s", rid, msg)
        self.counters["quarantined"] += 1
        self.table.finish(flight, self.table.router_error(rid, 503, msg, QUARANTINED, worker_id), "failed")
        return True

    async def _expire_inactive(self) -> None:
        """A placed request that made no progress for `request_timeout_s`, over all its workers,
        is answered 504; one whose current worker was silent for a share of that budget (a hung
        stream, a lost message) is placed elsewhere first."""
        if self.limits.request_timeout_s is None:
            return
        loop_now = asyncio.get_running_loop().time()
        share = self.limits.request_timeout_s / (self.limits.max_resubmits + 1)
        for flight in [f for f in self.table.flights.values() if f.owner is not None and not f.done]:
            spent = loop_now - flight.progress_at > self.limits.request_timeout_s
            if not spent and loop_now - flight.active_at <= share:
                continue
            owner, rid = flight.owner, flight.route.rid
            self.counters["timed_out"] += 1
            if spent or flight.resubmits >= self.limits.max_resubmits or owner is None:
                msg = f"no progress in {loop_now - flight.progress_at:.0f} s on workers {', '.join(flight.hops)}"
                self.table.finish(flight, self.table.router_error(rid, 504, msg, TIMED_OUT, owner), "failed")
                if owner is not None:
                    self.outbox.spawn(self.outbox.send(owner, Abort(rid=rid)))
                continue
            self.table.release(flight)
            flight.stale.append(owner)
            await self.placement.resubmit(flight, owner, f"no progress from worker {owner} in {share:g} s")

    async def reconcile(self, worker_id: str, held: tuple[str, ...], now: float) -> None:
        """Match the worker's own list of the requests it holds against the router's."""
        holding = set(held)
        flights = self.table.flights
        for rid in self.registry.inflight_on(worker_id):
            flight = flights.get(rid)
            if flight is None or flight.owner != worker_id or flight.done or rid in holding:
                continue
            if now - flight.placed_s < self.limits.reconcile_grace_s or flight.prefill is not None:
                continue  # the Submit may still be on its way (a PD pair answers through its prefill)
            self.counters["reconciled_lost"] += 1
            self.table.release(flight)
            await self.placement.resubmit(flight, None, f"worker {worker_id} lost the request")
        for rid in holding:
            flight = flights.get(rid)
            ended = self.table.recently_ended.get(rid)
            if ended is not None and now - ended < self.limits.reconcile_grace_s:
                continue  # it just ended here: the worker is letting go of it
            if flight is None or (flight.owner != worker_id and flight.prefill != worker_id):
                self.counters["orphans_aborted"] += 1
                await self.outbox.send(worker_id, Abort(rid=rid))
