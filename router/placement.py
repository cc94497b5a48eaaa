"""Placing a request on a worker, and placing it again after its worker died or failed.

A request's owner changes in the same synchronous step that snapshots the tokens to resume from
(`Placement.assign`), so no chunk can be delivered between "what the new worker resumes from"
and "whose chunks count": all state lives on the event loop thread, and there is no `await` in
between.

What does not carry over (router/handover.py): a grammar-constrained request is never migrated
by choice after its first token; when its worker is lost it restarts from scratch if its client
has seen nothing yet (not streamed: a `restart` chunk voids what came before), else it ends with
an error. Stop strings spanning a hand-over are matched over the router's decoded text.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import NO_WORKER, WORKER_FAILED, Flight, StreamChunk, StreamError
from router.flight_table import FlightTable
from router.handover import Decode, StopWatch, constraint_of, stop_regexes, stop_strings
from router.pd import DECODE
from router.pd_pairing import PdPairing
from router.policies.base import NoWorkerError
from router.protocol import Submit
from router.resume import cap_reached, resume_route, resume_submit

logger = logging.getLogger(__name__)

DECISION_WINDOW = 1024  # recent policy.choose latencies kept for status()


class Placement(DispatchPart):
    """Asks the policy for a worker (and a PD partner), sends the Submit, and resubmits requests
    whose worker was lost, up to `max_resubmits` times; a request with no worker to go to waits
    `resume_timeout_s` for one. `decode` is the router's detokenizer (stop strings across a
    hand-over), None without one."""

    def __init__(self, handle: DispatchHandle, table: FlightTable, pairing: PdPairing, decode: Decode | None) -> None:
        super().__init__(handle)
        self.table = table
        self.pairing = pairing
        self.decode = decode
        self.decision_ns: deque[int] = deque(maxlen=DECISION_WINDOW)

    def assign(self, flight: Flight, worker_id: str, prefill: str | None = None) -> Submit:
        """Make `worker_id` the owner and build its Submit, in one synchronous step (see module doc).

        With a `prefill` partner (PD) the Submit carries a fresh bootstrap room; the same message
        goes to both workers of the pair, and only the owner's (decode) chunks reach the client.
        """
        msg = resume_submit(flight.submit, flight.delivered)
        flight.watch = self._stop_watch(msg)
        if prefill is not None:
            msg = self.pairing.pair(flight, msg, prefill)
        flight.owner = worker_id
        flight.hops.append(worker_id)
        flight.placed_s = self.clock()
        flight.active_at = asyncio.get_running_loop().time()
        flight.placed_delivered = len(flight.delivered)
        self.registry.track(flight.route.rid, worker_id)
        self.routed[worker_id] += 1
        return msg

    def _stop_watch(self, msg: Submit) -> StopWatch | None:
        """What matches `msg`'s stop strings across its hand-over (None: nothing to match)."""
        stops, regexes = stop_strings(msg.sampling_params), stop_regexes(msg.sampling_params)
        if not msg.resume_output_ids or not (stops or regexes) or self.decode is None:
            return None
        try:
            watch = StopWatch(stops, msg.resume_output_ids, self.decode, regexes)
            return None if watch.done else watch
        except Exception:  # noqa: BLE001 - no decoder yet: the worker's own matching is all there is
            logger.exception("cannot watch the stop strings of %s", msg.rid)
            return None

    def _choose(self, flight: Flight, exclude: set[str]) -> tuple[str, str | None] | None:
        """(owner, prefill partner or None), or None when no worker can take it."""
        now = self.clock()
        t0 = time.perf_counter_ns()
        route = resume_route(flight.route, len(flight.delivered))
        try:
            views, prefill = self.pairing.policy_views(now, route, exclude)
            decision = self.policy.choose(route, views, now)
        except NoWorkerError:
            return None
        finally:
            self.decision_ns.append(time.perf_counter_ns() - t0)
            self.counters["decisions"] += 1
        owner = decision.worker_id
        role = next((v.role for v in views if v.worker_id == owner), None)
        return owner, prefill if role == DECODE else None

    async def place(self, flight: Flight, exclude: Iterable[str] = ()) -> bool:
        """Send the request (resuming after what was delivered) to a policy-chosen worker.

        False when no healthy worker is left; True when placed, or when it needed no placement
        (it ended meanwhile, or its token cap is already reached: then it is finished here).
        """
        if cap_reached(flight.submit, len(flight.delivered)):  # only the finish chunk was lost
            final = StreamChunk(flight.route.rid, (), len(flight.delivered), None, finish_reason="length")
            self.table.finish(flight, final, "completed")
            return True
        if flight.delivered and not self._restart_constrained(flight):
            return True
        excluded = set(exclude)
        while not flight.done:
            if flight.stale:
                await self.table.flush_aborts(flight)
                continue  # re-check: it may have ended meanwhile
            choice = self._choose(flight, excluded)
            if choice is None:
                return False
            worker_id, prefill = choice
            gone = [
                w
                for w in (worker_id, prefill)
                if w is not None and (self.registry.identity_of(w) is None or not self.registry.is_alive(w))
            ]
            if gone:
                self.policy.on_finished(flight.route.rid, worker_id)
                excluded.update(gone)
                continue
            msg = self.assign(flight, worker_id, prefill)
            if not await self.outbox.send(worker_id, msg):
                if flight.owner == worker_id:  # not connected after all; try the others
                    self.table.release(flight)
                excluded.add(worker_id)
                continue
            if prefill is None or flight.prefill != prefill or await self.outbox.send(prefill, msg):
                return True
            if flight.owner == worker_id:  # the decode half waits for a prefill that never comes
                self.table.release(flight)
                flight.stale.append(worker_id)
            excluded.add(prefill)
        return True

    def _restart_constrained(self, flight: Flight) -> bool:
        """A grammar-constrained request about to resume elsewhere: its grammar would restart at
        its root mid-output. Not streamed, it starts over (True); streamed, its client already has
        tokens, so it ends with an error naming why (False)."""
        name = constraint_of(flight.submit.sampling_params)
        if name is None:
            return True
        rid, n = flight.route.rid, len(flight.delivered)
        if flight.submit.stream:
            msg = f"lost its worker after {n} streamed tokens; its {name} grammar cannot be resumed on another worker"
            self.table.finish(flight, self.table.router_error(rid, 502, msg, WORKER_FAILED), "failed")
            return False
        flight.delivered.clear()
        flight.first_token_s = None
        self.table.unstarted.add(rid)
        self.counters["restarted"] += 1
        flight.queue.put_nowait(StreamChunk(rid, (), 0, None, restart=True))
        return True

    async def resubmit(self, flight: Flight, away_from: str | None, why: str) -> None:
        """Move a request off `away_from` (dead, failing): resume elsewhere, or wait for a worker."""
        if flight.done:
            return
        if flight.resubmits >= self.limits.max_resubmits:
            msg = f"{why}; gave up after {flight.resubmits} resubmissions"
            self.table.finish(flight, self.table.router_error(flight.route.rid, 502, msg, WORKER_FAILED), "failed")
            return
        flight.resubmits += 1
        self.counters["resubmitted"] += 1
        logger.info("resubmitting %s (%s) after %d tokens", flight.route.rid, why, len(flight.delivered))
        if not await self.place(flight, exclude=() if away_from is None else (away_from,)):
            flight.waiting_since = asyncio.get_running_loop().time()
            self.table.waiting[flight.route.rid] = flight

    async def retry_waiting(self) -> None:
        """Place requests whose worker died once a worker is back; end those that waited too long."""
        now = asyncio.get_running_loop().time()
        waiting = self.table.waiting
        for rid, flight in list(waiting.items()):
            if waiting.pop(rid, None) is None or flight.done:
                continue  # another coroutine took it meanwhile
            if await self.place(flight):
                flight.waiting_since = None
            elif flight.waiting_since is not None and now - flight.waiting_since >= self.limits.resume_timeout_s:
                msg = f"no healthy worker to resume on within {self.limits.resume_timeout_s:g} s"
                self.table.finish(flight, self.table.router_error(rid, 503, msg, NO_WORKER), "failed")
            else:
                waiting[rid] = flight

    async def prefill_failed(self, flight: Flight, status: int, message: str) -> None:
        """The prefill half died or failed: abort the decode half and pair the request again."""
        prefill, rid = flight.prefill, flight.route.rid
        self.counters["pd_prefill_failed"] += 1
        if flight.delivered:  # decode already streams: the KV arrived, the partner is not needed
            self.pairing.drop(flight, abort=False)
            return
        owner = self.table.release(flight)
        if owner is not None:
            flight.stale.append(owner)
        if status < 500:
            self.table.finish(flight, StreamError(rid, status, message, prefill), "failed")
            return
        await self.resubmit(flight, prefill, f"prefill worker {prefill} failed: {message}")
