"""The dispatcher's receive loop: every message a worker sends, and what it does to the streams.

Chunks are placed by their output position (router/resume.py): a resent head that matches what
was delivered is trimmed (the chunk loses its `text`, which cannot be cut by token); a gap or a
mismatch is a worker failure (a 502 for the retry logic), so a worker that counts only its new
tokens fails loudly instead of silently losing some.

A request the worker shed (queue full, SLO infeasible, queue timeout) is answered as shed, never
retried elsewhere (that would add load exactly when the pool is overloaded); only a draining
worker's is.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import replace

import zmq

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import StreamChunk, StreamError
from router.flight_table import FlightTable
from router.placement import Placement
from router.protocol import (
    Abort,
    Ack,
    Fetch,
    FetchReply,
    Heartbeat,
    LoadReport,
    Message,
    Register,
    RequestError,
    TokenChunk,
)
from router.reaper import Reaper
from router.transport import RouterEndpoint
from scheduler.core.shed_wire import shed_from
from wire import DRAINING, REGISTER_AGAIN

logger = logging.getLogger(__name__)


class WorkerInbox(DispatchPart):
    """Handles registrations, heartbeats, load reports, fetch replies and each request's chunks
    and errors; a worker's 5xx is retried `max_error_retries` times elsewhere."""

    def __init__(
        self, handle: DispatchHandle, endpoint: RouterEndpoint, table: FlightTable, placement: Placement, reaper: Reaper
    ) -> None:
        super().__init__(handle)
        self.endpoint = endpoint
        self.table = table
        self.placement = placement
        self.reaper = reaper
        self.registered = asyncio.Event()  # replaced after each registration: wakes admission waits
        self._fetches: dict[str, asyncio.Future[FetchReply]] = {}

    async def receive_loop(self) -> None:
        while True:
            try:
                identity, msg = await self.endpoint.recv()
            except zmq.ZMQError as exc:  # the caller closed the endpoint under us
                logger.warning("dispatcher receive loop ends: %s", exc)
                return
            try:
                await self._handle(identity, msg)
            except Exception:  # noqa: BLE001 - one bad message must not stop the router
                logger.exception("error handling %s from %r", msg.TYPE, identity)

    async def fetch(self, worker_id: str, method: str, path: str, timeout_s: float) -> FetchReply:
        """The worker's own HTTP answer to `method path`, asked over the worker link; TimeoutError
        when it does not answer in time, ConnectionError when it cannot be reached."""
        fetch_id = secrets.token_hex(16)
        future: asyncio.Future[FetchReply] = asyncio.get_running_loop().create_future()
        self._fetches[fetch_id] = future
        try:
            if not await self.outbox.send(worker_id, Fetch(fetch_id=fetch_id, method=method, path=path)):
                raise ConnectionError(f"worker {worker_id} is not connected")
            return await asyncio.wait_for(future, timeout_s)
        finally:
            self._fetches.pop(fetch_id, None)

    async def _register(self, identity: bytes, msg: Register, now: float) -> Ack | None:
        """The registry's answer to an authenticated Register (None: a Challenge went out)."""
        if self.auth.enabled:
            if msg.proof is None:
                await self.endpoint.send(identity, self.auth.challenge(identity))
                return None
            refused = self.auth.verify(identity, msg)
            if refused is not None:
                logger.warning("refused a Register for %s: %s", msg.worker_id, refused)
                return Ack(accepted=False, reason=refused)
        peer_host = getattr(self.endpoint, "peer_host", None)
        ack = self.registry.register(msg, now, identity, peer_host(identity) if peer_host else None)
        if ack.accepted and self.auth.enabled:
            ack = self.auth.accept(msg, ack)
        return ack

    async def _on_register(self, identity: bytes, msg: Register, now: float) -> None:
        known = self.registry.registration(msg.worker_id)
        restarted = known is not None and (known.incarnation is None or known.incarnation != msg.incarnation)
        alive = self.registry.is_alive(msg.worker_id)
        previous = self.registry.inflight_on(msg.worker_id) if alive and restarted else []
        ack = await self._register(identity, msg, now)
        if ack is None:
            return
        await self.endpoint.send(identity, ack)
        if not ack.accepted:
            return
        trust = getattr(self.endpoint, "trust", None)  # its larger frames may now be decoded
        if trust is not None:
            trust(identity)
        self.registered.set()
        self.registered = asyncio.Event()
        for rid in previous:  # a live worker's new process: its work is gone
            flight = self.table.flights.get(rid)
            if flight is not None and flight.owner == msg.worker_id:
                self.table.release(flight)
                await self.placement.resubmit(flight, None, f"worker {msg.worker_id} restarted")
        await self.placement.retry_waiting()

    async def _handle(self, identity: bytes, msg: Message) -> None:
        now = self.clock()
        if isinstance(msg, Register):
            await self._on_register(identity, msg, now)
            return
        worker_id = getattr(msg, "worker_id", None)
        if worker_id is None:
            logger.debug("ignoring %s from worker %r", msg.TYPE, identity)
            return
        if not self.registry.speaks_for(worker_id, identity):
            if self.registry.registration(worker_id) is not None:  # another connection's worker
                self.counters["foreign_dropped"] += 1
                return
            await self.endpoint.send(identity, Ack(accepted=False, reason=REGISTER_AGAIN))  # unknown: a restart
            return
        self.registry.touch(worker_id, now)  # any message proves life, even a stale heartbeat
        if isinstance(msg, Heartbeat):
            self.registry.heartbeat(msg, now)
        elif isinstance(msg, LoadReport):
            if self.registry.report(msg, now) and msg.inflight is not None:
                await self.reaper.reconcile(worker_id, msg.inflight, now)
        elif isinstance(msg, FetchReply):
            future = self._fetches.pop(msg.fetch_id, None)
            if future is not None and not future.done():
                future.set_result(msg)
        elif isinstance(msg, TokenChunk):
            if not await self._on_prefill_message(msg):
                await self._on_chunk(msg, now)
        elif isinstance(msg, RequestError):
            if not await self._on_prefill_message(msg):
                await self._on_error(msg)
        if not self.registry.is_alive(worker_id):  # reaped while it stalled, or the router restarted
            await self.endpoint.send(identity, Ack(accepted=False, reason=REGISTER_AGAIN))

    async def _on_prefill_message(self, msg: TokenChunk | RequestError) -> bool:
        """A PD pair's prefill half answering; False when `msg` is not from a current partner.

        Its tokens never reach the client (the decode half streams the same first token); its
        finish means the KV has been handed over, its error means the pair must be redone.
        """
        flight = self.table.flights.get(msg.rid)
        if flight is None or flight.prefill is None or flight.prefill != msg.worker_id:
            return False
        if isinstance(msg, RequestError):
            await self.placement.prefill_failed(flight, msg.status, msg.message)
        elif msg.finish_reason is not None:
            self.placement.pairing.drop(flight, abort=False)
        return True

    async def _on_chunk(self, chunk: TokenChunk, now: float) -> None:
        flight = self.table.owned(chunk.rid, chunk.worker_id)
        if flight is None:
            return
        tokens, text = chunk.token_ids, chunk.text
        start = chunk.completion_tokens - len(tokens)
        have = len(flight.delivered)
        cut = min(max(have - start, 0), len(tokens))  # a resent head: positions already delivered
        if start < 0 or start > have or tuple(flight.delivered[start : start + cut]) != tokens[:cut]:
            what = "a gap" if start > have else "a mismatch with the delivered tokens"
            reason = f"chunk at output positions {start}..{chunk.completion_tokens} after {have} delivered is {what}"
            await self._on_error(RequestError(rid=chunk.rid, worker_id=chunk.worker_id, status=502, message=reason))
            return
        if cut:
            self.counters["duplicate_tokens_trimmed"] += cut
            tokens, text = tokens[cut:], None
            if not tokens and chunk.finish_reason is None:
                return
        stopped = None
        if flight.watch is not None and tokens:
            try:
                stopped = flight.watch.feed(tokens)
            except Exception:  # noqa: BLE001 - a decoder failure must not lose the chunk
                logger.exception("cannot match the stop strings of %s", chunk.rid)
                flight.watch.done = True
            if flight.watch.done:
                flight.watch = None
        if stopped is not None:  # a stop string spanning the hand-over: end here, as the worker would
            keep, matched = stopped
            tokens, text = tokens[:keep], None
            chunk = replace(chunk, finish_reason="stop", meta={"finish_reason": {"type": "stop", "matched": matched}})
            self.counters["stopped_at_handover"] += 1
            self.outbox.spawn(self.outbox.send(chunk.worker_id, Abort(rid=chunk.rid)))
        flight.delivered.extend(tokens)
        flight.active_at = asyncio.get_running_loop().time()
        if tokens:
            flight.progress_at = flight.active_at
        if tokens and flight.first_token_s is None:
            flight.first_token_s = now
            self.table.unstarted.discard(chunk.rid)
        event = StreamChunk(
            rid=chunk.rid,
            token_ids=tokens,
            completion_tokens=len(flight.delivered),
            worker_id=chunk.worker_id,
            text=text,
            finish_reason=chunk.finish_reason,
            meta=chunk.meta,
        )
        if chunk.finish_reason is not None:
            self.table.finish(flight, event, "completed")
        else:
            flight.queue.put_nowait(event)

    async def _on_error(self, err: RequestError) -> None:
        """4xx: the request is bad, pass it through. A shed: pass it through (a draining worker's
        is placed elsewhere). Other 5xx: the worker failed, retry once elsewhere."""
        flight = self.table.owned(err.rid, err.worker_id)
        if flight is None:
            return
        shed = shed_from(err.shed)
        passthrough = StreamError(err.rid, err.status, err.message, err.worker_id, shed)
        if shed is not None and shed.reason != DRAINING:
            self.table.finish(flight, passthrough, "shed")
            return
        if shed is not None:  # draining: the worker hands it back, it failed nothing
            self.table.release(flight)
            await self.placement.resubmit(flight, err.worker_id, f"worker {err.worker_id} is draining")
            return
        if err.status < 500 or flight.error_retries >= self.limits.max_error_retries:
            self.table.finish(flight, passthrough, "failed")
            return
        flight.error_retries += 1
        self.table.release(flight)
        self.outbox.spawn(self.outbox.send(err.worker_id, Abort(rid=err.rid)))  # in case it still holds it
        if flight.resubmits < self.limits.max_resubmits and await self.placement.place(flight, exclude={err.worker_id}):
            flight.resubmits += 1
            self.counters["resubmitted"] += 1
            return
        if not flight.done:  # no other worker to retry on: the client gets the worker's answer
            self.table.finish(flight, passthrough, "failed")
