"""The worker side of the router protocol: a worker's link to the router.

Runs inside the worker's HTTP process (a daemon thread with its own event loop), so it lives and
dies with the server: a killed worker stops heartbeating and the router fails its requests over.
It registers (GPU kind, KV capacity, batch cap, longest prompt), proving the worker secret when
one is set (router/worker_auth.py: it takes work only from a router that proves it too),
heartbeats with the engine's step counter (a hung engine is noticed, not just a dead agent),
reports load (server/agent_load.py) with the router's requests it holds, and hands each Submit,
Abort and Fetch to the request half (server/agent_requests.py: every Submit gets exactly one
final message, unless the router itself cancelled it).

An exception in one request, or in the agent's loops, never ends the link: a failed run of the
agent is logged and started again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import zmq
import zmq.asyncio

from router.protocol import (
    MAX_INFLIGHT_LISTED,
    Abort,
    Ack,
    Challenge,
    Fetch,
    Heartbeat,
    LoadReport,
    Register,
    RequestError,
    Shutdown,
    Submit,
    TokenChunk,
)
from router.transport import WorkerEndpoint
from router.worker_auth import AuthError, WorkerAuth
from server.agent_config import AgentConfig
from server.agent_requests import AgentRequests
from server.draining import Drain
from wire import REGISTER_AGAIN

logger = logging.getLogger(__name__)

REGISTER_RETRY_S = 1.0  # until the router answers (it may start after the worker)
REFUSED_RETRY_S = 5.0  # the router refused us (wrong secret): keep trying, loudly
RESTART_BACKOFF_S = 1.0  # a failed run of the agent is started again after this
HAND_BACK_S = 2.0  # a drain's hand-back of unfinished requests


class WorkerAgent:
    """One connection to the router; `run()` until cancelled or the router says Shutdown."""

    def __init__(
        self, config: AgentConfig, engine_status: Callable[[], dict[str, Any]], drain: Drain | None = None
    ) -> None:
        self.config = config
        self.engine_status = engine_status
        self.drain = drain if drain is not None else Drain()
        self.auth = WorkerAuth(config.worker_secret)
        self.requests = AgentRequests(config, engine_status, self.drain, self._send)
        self.registered = False
        self.auth_dropped = 0  # router messages that failed authentication
        self._seq = itertools.count()
        self._endpoint: WorkerEndpoint | None = None
        self._register_sent = 0.0
        self._refused = False
        self.incarnation = secrets.token_hex(8)
        # A routing identity of our own, never announced: no other peer can speak for us.
        self.identity = b"w" + secrets.token_bytes(15)
        self.loop: asyncio.AbstractEventLoop | None = None

    # --- lifecycle ---

    async def run(self) -> None:
        self.loop = asyncio.get_running_loop()
        ctx = zmq.asyncio.Context()
        self._endpoint = WorkerEndpoint(
            self.config.router_address,
            self.config.worker_id,
            allow_remote=self.config.allow_remote,
            ctx=ctx,
            curve=self.config.curve,
            identity=self.identity,
        )
        self.requests.open()
        try:
            await self._wait_for_engine()
            await self._register()
            await asyncio.gather(
                self._receive_loop(),
                self._every(self.config.heartbeat_s, self._heartbeat_tick, "heartbeat"),
                self._every(self.config.report_s, self._report_tick, "load report"),
            )
        finally:
            await self.requests.close()
            self._endpoint.close()
            ctx.term()

    async def _wait_for_engine(self) -> None:
        """Register only once the server answers and the scheduler has published its capacity."""
        while True:
            healthy = await self.requests.server_answers()
            if healthy and self.engine_status().get("kv_capacity_tokens"):
                return
            await asyncio.sleep(0.5)

    def _registration(self) -> Register:
        engine = self.engine_status()
        max_input = engine.get("max_input_tokens")
        return Register(
            worker_id=self.config.worker_id,
            gpu=self.config.gpu,
            model=self.config.model,
            kv_capacity_tokens=max(1, int(engine.get("kv_capacity_tokens") or 1)),
            max_running=max(1, int(engine.get("max_running_requests") or 1)),
            http_url=self.config.advertised_url or self.config.http_url,
            incarnation=self.incarnation,
            role=self.config.role,
            bootstrap_port=self.config.bootstrap_port,
            tier_ms=self.config.tier_ms,
            time_scale=self.config.time_scale,
            max_input_tokens=max_input if isinstance(max_input, int) and max_input > 0 else None,
            slo_levers=engine.get("slo_levers") is True,
        )

    async def _register(self) -> None:
        self._register_sent = time.monotonic()
        await self._send(self.auth.hello(self._registration()))

    # --- messages from the router ---

    async def _receive_loop(self) -> None:
        assert self._endpoint is not None
        while True:
            raw = await self._endpoint.recv()
            try:
                msg = self.auth.open(raw)
            except AuthError as exc:
                self.auth_dropped += 1
                logger.warning("worker %s dropped a router message: %s", self.config.worker_id, exc)
                continue
            try:
                if isinstance(msg, Shutdown):
                    logger.info("router asked worker %s to leave", self.config.worker_id)
                    return
                await self._on_message(msg)
            except Exception:  # noqa: BLE001 - one bad message must not end the link
                logger.exception("worker %s failed handling %s", self.config.worker_id, msg.TYPE)

    async def _on_message(self, msg: Any) -> None:
        if isinstance(msg, Challenge):
            answer = self.auth.answer(msg, self._registration())
            if answer is None:
                self._refused = True
                logger.error("the router requires a worker secret: start this worker with --worker-secret(-file)")
                return
            await self._send(answer)
        elif isinstance(msg, Ack):
            self._on_ack(msg)
            if msg.reason == REGISTER_AGAIN and time.monotonic() - self._register_sent >= REGISTER_RETRY_S:
                # It lost us (a stall, or it restarted). Every message sent before it knew
                # draws this answer; one Register at a time, since each new one replaces the
                # challenge the last one is about to answer (and both were refused).
                await self._register()
        elif isinstance(msg, Submit):
            self.requests.start(msg)
        elif isinstance(msg, Abort):
            self.requests.cancel(msg.rid)  # closing the HTTP stream makes SGLang abort the request
        elif isinstance(msg, Fetch):
            asyncio.create_task(self.requests.fetch(msg))

    def _on_ack(self, ack: Ack) -> None:
        if ack.accepted:
            if not self.auth.accept(ack):
                self.registered, self._refused = False, True
                logger.error(
                    "worker %s: the router did not prove the worker secret; not serving it", self.config.worker_id
                )
                return
            if not self.registered:
                logger.info("worker %s registered with the router (%s)", self.config.worker_id, ack.reason)
            self.registered, self._refused = True, False
            return
        self.registered = False
        self._refused = ack.reason != REGISTER_AGAIN
        logger.warning("router refused worker %s: %s", self.config.worker_id, ack.reason)

    # --- timers ---

    async def _every(self, period_s: float, tick: Callable[[], Awaitable[None]], what: str) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                await tick()
            except Exception:  # noqa: BLE001 - a tick that fails must not stop the next
                logger.exception("worker %s %s failed", self.config.worker_id, what)

    async def _heartbeat_tick(self) -> None:
        """Heartbeats while registered; otherwise Register again now and then (router restarts)."""
        if self.registered:
            await self._send(self._heartbeat())
            return
        retry = REFUSED_RETRY_S if self._refused else REGISTER_RETRY_S
        if time.monotonic() - self._register_sent >= retry:
            await self._register()

    def _heartbeat(self) -> Heartbeat:
        engine = self.engine_status()
        steps = engine.get("steps")
        busy = bool(self.requests.tasks) or bool(engine.get("waiting")) or bool(engine.get("running"))
        return Heartbeat(
            worker_id=self.config.worker_id,
            seq=next(self._seq),
            engine_steps=steps if isinstance(steps, int) and steps >= 0 else None,
            busy=busy,
            draining=self.drain.active,
        )

    async def _report_tick(self) -> None:
        if self.registered:
            await self._send(self._report())

    def _report(self) -> LoadReport:
        engine = self.engine_status()
        fields = self.requests.load_fields(engine)
        held = tuple(self.requests.tasks)
        drain = engine.get("queue_drain_s")
        return LoadReport(
            worker_id=self.config.worker_id,
            seq=next(self._seq),
            **fields,
            inflight=held if len(held) <= MAX_INFLIGHT_LISTED else None,
            queue_drain_s=float(drain) if isinstance(drain, (int, float)) and drain >= 0 else None,
            draining=self.drain.active,
        )

    async def hand_back(self) -> None:
        """Draining ran out of time: every request still here goes back to the router (503
        draining, which it places elsewhere, resuming from the tokens already streamed)."""
        await self.requests.end_all(quiet=False)

    async def _send(self, msg: Any) -> None:
        assert self._endpoint is not None
        try:
            await self._endpoint.send(msg)
        except zmq.ZMQError as exc:  # the router is down or restarting: perishable messages are dropped
            level = logging.WARNING if isinstance(msg, (TokenChunk, RequestError)) else logging.DEBUG
            logger.log(level, "worker %s could not send %s: %s", self.config.worker_id, msg.TYPE, exc)


class AgentHandle:
    """The agent's thread as the rest of the process sees it."""

    def __init__(self, config: AgentConfig, engine_status: Callable[[], dict[str, Any]], drain: Drain) -> None:
        self.config = config
        self.engine_status = engine_status
        self.drain = drain
        self.agent: WorkerAgent | None = None
        self.thread = threading.Thread(target=self._main, name="slo-router-agent", daemon=True)

    def _main(self) -> None:
        """Run the agent; a run that fails is logged and started again (the server keeps serving
        direct clients meanwhile). A Shutdown from the router ends it for good."""
        while True:
            self.agent = WorkerAgent(self.config, self.engine_status, self.drain)
            try:
                asyncio.run(self.agent.run())
                return
            except Exception:  # noqa: BLE001 - a broken link must not end the worker's membership
                logger.exception("router agent of worker %s failed; starting it again", self.config.worker_id)
            time.sleep(RESTART_BACKOFF_S)

    def hand_back(self, timeout_s: float = HAND_BACK_S) -> None:
        """From any thread: give the router back what is still running here (a drain's end)."""
        agent = self.agent
        if agent is None or agent.loop is None or agent.loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(agent.hand_back(), agent.loop)
        try:
            future.result(timeout_s)
        except (concurrent.futures.TimeoutError, RuntimeError):
            logger.warning("worker %s: handing requests back timed out", self.config.worker_id)


def start_agent_thread(
    config: AgentConfig, engine_status: Callable[[], dict[str, Any]], drain: Drain | None = None
) -> AgentHandle:
    """Run the agent on its own event loop in a daemon thread (it ends with the process)."""
    handle = AgentHandle(config, engine_status, drain if drain is not None else Drain())
    handle.thread.start()
    return handle
