"""The life of a worker agent stand-in on a real zmq.asyncio DEALER socket, shared by the router tests.

A fake worker registers (proving a worker secret when given one, as the real agent does),
heartbeats every `heartbeat_s` (unless `stalled`), registers again when the router says
REGISTER_AGAIN, records every Ack, Submit and Abort, answers Fetches (`on_fetch`) and streams each
Submit in a task of its own; subclasses say what it registers with (`register_message`) and how
it streams (`_stream`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq.asyncio

from router.protocol import Abort, Ack, Challenge, Fetch, FetchReply, Heartbeat, LoadReport, Register, Submit
from router.transport import WorkerEndpoint
from router.worker_auth import AuthError, WorkerAuth
from wire import REGISTER_AGAIN


class FakeWorkerBase:
    """Registration, heartbeats and the receive loop; `_stream` answers one Submit."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        address: str,
        worker_id: str,
        *,
        delay_s: float,
        heartbeat_s: float,
        error_status: int | None,
        secret: bytes | None = None,
        identity: bytes | None = None,
    ) -> None:
        self.worker_id = worker_id
        self.auth = WorkerAuth(secret)
        self.auth_dropped = 0
        self.delay_s = delay_s
        self.heartbeat_s = heartbeat_s
        self.error_status = error_status
        self.endpoint = WorkerEndpoint(address, worker_id, ctx=ctx, identity=identity)
        self.submits: list[Submit] = []
        self.aborts: list[str] = []
        self.acks: list[Ack] = []
        self.alive = True
        self.stalled = False  # heartbeats paused, as in a long GC pause or a hung driver call
        self.registered = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, wait: bool = True) -> None:
        self._spawn(self._receive())
        self._spawn(self._heartbeat())
        await self._register()
        if wait:
            await asyncio.wait_for(self.registered.wait(), 2.0)

    async def stop(self) -> None:
        self.alive = False
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.endpoint.close()

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def register_message(self) -> Register:
        raise NotImplementedError

    async def _register(self) -> None:
        await self.endpoint.send(self.auth.hello(self.register_message()))

    def on_fetch(self, fetch: Fetch) -> FetchReply:
        return FetchReply(
            worker_id=self.worker_id, fetch_id=fetch.fetch_id, status=404, content_type="text/plain", body="no"
        )

    async def _heartbeat(self) -> None:
        seq = 0
        while self.alive:
            if not self.stalled:
                await self.endpoint.send(Heartbeat(worker_id=self.worker_id, seq=seq))
                seq += 1
            await asyncio.sleep(self.heartbeat_s)

    async def _receive(self) -> None:
        while True:
            try:
                msg = self.auth.open(await self.endpoint.recv())
            except AuthError:
                self.auth_dropped += 1
                continue
            if isinstance(msg, Challenge):
                answer = self.auth.answer(msg, self.register_message())
                if answer is not None:
                    await self.endpoint.send(answer)
            elif isinstance(msg, Fetch):
                await self.endpoint.send(self.on_fetch(msg))
            elif isinstance(msg, Ack):
                self.acks.append(msg)
                if msg.accepted and self.auth.accept(msg):
                    self.registered.set()
                elif msg.reason == REGISTER_AGAIN:
                    await self._register()
            elif isinstance(msg, Submit):
                self.submits.append(msg)
                if self.alive:
                    self._spawn(self._stream(msg))
            elif isinstance(msg, Abort):
                self.aborts.append(msg.rid)

    async def _stream(self, submit: Submit) -> None:
        raise NotImplementedError


async def until(cond: Callable[[], bool], timeout_s: float = 3.0) -> None:
    """Poll `cond` until it holds; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.01)


def load_report(worker_id: str, seq: int, **measured: Any) -> LoadReport:
    """A worker's load report that measured nothing but what `measured` sets (an idle engine)."""
    idle: dict[str, Any] = {
        "queue_len": 0,
        "running": 0,
        "kv_used_tokens": 0,
        "queue_delay_s": 0.0,
        "prefill_s_per_token": 0.0,
        "decode_s_per_token": 0.0,
        "iteration_s": 0.0,
        "tokens_per_minute": 0.0,
    }
    return LoadReport(worker_id=worker_id, seq=seq, **{**idle, **measured})
