"""The worker side of the router protocol: a worker's link to the router.

Runs inside the worker's HTTP process (a daemon thread with its own event loop), so it lives and
dies with the server: a killed worker stops heartbeating and the router fails its requests over.
It registers (GPU kind, KV capacity, batch cap, longest prompt), proving the worker secret when
one is set (router/worker_auth.py: it takes work only from a router that proves it too),
heartbeats with the engine's step counter (a hung engine is noticed, not just a dead agent),
reports load (server/agent_load.py) with the router's requests it holds, and runs each Submit
through the worker's own HTTP `/generate`, so routed requests take exactly the path a direct
client's would (SLO parsing, the SLO scheduler, reports). Tokens go back as TokenChunks whose
`completion_tokens` count resumed tokens too (the dispatcher's resume convention).

Every Submit gets exactly one final message: its last TokenChunk, or a RequestError however its
run ends (an error, a crash in the agent's own code, a drain handing it back), unless the router
itself cancelled it. An exception in one request, or in the agent's loops, never ends the link:
a failed run of the agent is logged and started again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import zmq
import zmq.asyncio

from router.protocol import (
    MAX_INFLIGHT_LISTED,
    Abort,
    Ack,
    Challenge,
    Fetch,
    FetchReply,
    Heartbeat,
    LoadReport,
    Register,
    RequestError,
    Shutdown,
    Submit,
    TokenChunk,
)
from router.transport import CurveKeys, WorkerEndpoint
from router.worker_auth import AuthError, WorkerAuth
from scheduler.core.admission import retry_after_s
from scheduler.core.shed_wire import Shed
from server.agent_load import REPORT_S, LoadEstimator, prefill_s_per_token, queued_s
from server.agent_stream import Chunk, parse_error_body, parse_line
from server.draining import Drain
from wire import AGENT_TOKEN_HEADER, ARRIVAL_HEADER, DRAINING, REGISTER_AGAIN

logger = logging.getLogger(__name__)

REGISTER_RETRY_S = 1.0  # until the router answers (it may start after the worker)
REFUSED_RETRY_S = 5.0  # the router refused us (wrong secret): keep trying, loudly
RESTART_BACKOFF_S = 1.0  # a failed run of the agent is started again after this
READ_BUFSIZE = 1 << 20  # a stream line may be long (a final chunk's meta_info)
MAX_FETCH_BODY = 1 << 20
HAND_BACK_S = 2.0  # a drain's hand-back of unfinished requests


@dataclass(frozen=True)
class AgentConfig:
    router_address: str
    worker_id: str
    gpu: str
    model: str  # the model path: the router loads its tokenizer from it
    http_url: str  # this worker's own HTTP server, as the agent calls it
    api_key: str | None = None  # this server's own key, for the agent's local calls only
    agent_token: str | None = None  # lets the middleware trust our forwarded arrival times
    worker_secret: bytes | None = None  # the router's worker credential (None: no authentication)
    allow_remote: bool = False
    heartbeat_s: float = 0.5
    report_s: float = REPORT_S
    role: str = "mixed"  # "prefill" / "decode" under PD disaggregation
    bootstrap_port: int | None = None  # a prefill worker's KV bootstrap port
    tier_ms: float | None = None  # the TPOT tier it starts in
    time_scale: float = 1.0  # --emulate-slowdown of an emulated GPU
    advertised_url: str | None = None  # where the router reaches it (default http_url; a wildcard host:
    # the router fills in where the connection comes from)
    curve: CurveKeys | None = None  # encrypts the link to the router


class WorkerAgent:
    """One connection to the router; `run()` until cancelled or the router says Shutdown."""

    def __init__(
        self, config: AgentConfig, engine_status: Callable[[], dict[str, Any]], drain: Drain | None = None
    ) -> None:
        self.config = config
        self.engine_status = engine_status
        self.drain = drain if drain is not None else Drain()
        self.auth = WorkerAuth(config.worker_secret)
        self.load = LoadEstimator()
        self.registered = False
        self.auth_dropped = 0  # router messages that failed authentication
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._quiet: set[asyncio.Task[None]] = set()  # cancelled by the router: no final message owed
        self._attempt = itertools.count()
        self._seq = itertools.count()
        self._endpoint: WorkerEndpoint | None = None
        self._session: aiohttp.ClientSession | None = None
        self._register_sent = 0.0
        self._refused = False
        self._no_first_token: dict[object, tuple[float, int]] = {}  # run -> (sent at, prompt tokens)
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
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        # No connection limit: every routed request must reach the SLO scheduler's own queue
        # (its order and admission), not wait FIFO in the client.
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0),
            read_bufsize=READ_BUFSIZE,
        )
        try:
            await self._wait_for_engine()
            await self._register()
            await asyncio.gather(self._receive_loop(), self._heartbeat_loop(), self._report_loop())
        finally:
            await self._end_all(quiet=True)
            await self._session.close()
            self._endpoint.close()
            ctx.term()

    async def _wait_for_engine(self) -> None:
        """Register only once the server answers and the scheduler has published its capacity."""
        assert self._session is not None
        while True:
            try:
                async with self._session.get(self.config.http_url + "/health") as resp:
                    healthy = resp.status == 200
            except aiohttp.ClientError:
                healthy = False
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
            self._start(msg)
        elif isinstance(msg, Abort):
            self._cancel(msg.rid)  # closing the HTTP stream makes SGLang abort the request
        elif isinstance(msg, Fetch):
            asyncio.create_task(self._fetch(msg))

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

    async def _heartbeat_loop(self) -> None:
        """Heartbeats while registered; otherwise Register again now and then (router restarts)."""
        while True:
            await asyncio.sleep(self.config.heartbeat_s)
            try:
                if self.registered:
                    await self._send(self._heartbeat())
                    continue
                retry = REFUSED_RETRY_S if self._refused else REGISTER_RETRY_S
                if time.monotonic() - self._register_sent >= retry:
                    await self._register()
            except Exception:  # noqa: BLE001 - a heartbeat that fails must not stop the next
                logger.exception("worker %s heartbeat failed", self.config.worker_id)

    def _heartbeat(self) -> Heartbeat:
        engine = self.engine_status()
        steps = engine.get("steps")
        busy = bool(self._tasks) or bool(engine.get("waiting")) or bool(engine.get("running"))
        return Heartbeat(
            worker_id=self.config.worker_id,
            seq=next(self._seq),
            engine_steps=steps if isinstance(steps, int) and steps >= 0 else None,
            busy=busy,
            draining=self.drain.active,
        )

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_s)
            try:
                if self.registered:
                    await self._send(self._report())
            except Exception:  # noqa: BLE001 - a report that fails must not stop the next
                logger.exception("worker %s load report failed", self.config.worker_id)

    def _report(self) -> LoadReport:
        engine = self.engine_status()
        now, per_token = time.monotonic(), prefill_s_per_token(engine)
        waits = [queued_s(now - sent, prompt, per_token) for sent, prompt in self._no_first_token.values()]
        fields = self.load.report_fields(engine, waits)
        drain = engine.get("queue_drain_s")
        return LoadReport(
            worker_id=self.config.worker_id,
            seq=next(self._seq),
            **fields,
            inflight=tuple(self._tasks) if len(self._tasks) <= MAX_INFLIGHT_LISTED else None,
            queue_drain_s=float(drain) if isinstance(drain, (int, float)) and drain >= 0 else None,
            draining=self.drain.active,
        )

    # --- requests ---

    def _start(self, submit: Submit) -> None:
        self._cancel(submit.rid)  # the router re-placed it here: the old run is stale
        task = asyncio.create_task(self._serve(submit))
        self._tasks[submit.rid] = task
        task.add_done_callback(lambda t, rid=submit.rid: self._done(rid, t))

    def _done(self, rid: str, task: asyncio.Task[None]) -> None:
        if self._tasks.get(rid) is task:
            del self._tasks[rid]
        self._quiet.discard(task)

    def _cancel(self, rid: str) -> None:
        """The router withdrew it (an Abort, or a new placement): it expects no answer."""
        task = self._tasks.pop(rid, None)
        if task is not None:
            self._quiet.add(task)
            task.cancel()

    async def _end_all(self, quiet: bool) -> None:
        tasks = list(self._tasks.values())
        if quiet:
            self._quiet.update(tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _serve(self, submit: Submit) -> None:
        """Stream one request from the local server back to the router; the `finally` makes
        sure the router hears how it ended, whatever happens here."""
        final: Any = None
        me = asyncio.current_task()
        try:
            final = await self._stream(submit)
        except asyncio.CancelledError:
            if self.drain.active:
                final = self._draining_error(submit.rid)
            raise
        except Exception as exc:  # noqa: BLE001 - any failure is the worker's, told as a 502
            logger.warning("worker %s: request %s failed: %s", self.config.worker_id, submit.rid, exc)
            final = self._error(submit.rid, 502, f"{type(exc).__name__}: {exc}")
        finally:
            if me not in self._quiet:
                if final is None:
                    final = self._error(submit.rid, 502, "the worker's run of the request ended without an answer")
                await self._send(final)

    async def _stream(self, submit: Submit) -> TokenChunk | RequestError:
        """The request's run on the local server; returns its final message (not yet sent)."""
        assert self._session is not None
        resumed = len(submit.resume_output_ids)
        body: dict[str, Any] = {
            "input_ids": [*submit.input_ids, *submit.resume_output_ids],
            "sampling_params": submit.sampling_params,
            "stream": True,
            # a unique local rid: a request migrated back here must not collide with its old run
            "rid": f"{submit.rid}#{next(self._attempt)}",
        }
        if submit.slo is not None:
            body["slo"] = submit.slo
        if submit.bootstrap is not None:  # one half of a PD pair: SGLang's own fields
            body["bootstrap_host"] = submit.bootstrap["host"]
            body["bootstrap_port"] = submit.bootstrap["port"]
            body["bootstrap_room"] = submit.bootstrap["room"]
        headers = {}
        if self.config.agent_token is not None:
            headers[AGENT_TOKEN_HEADER] = self.config.agent_token
            if submit.arrival_unix is not None:
                headers[ARRIVAL_HEADER] = repr(submit.arrival_unix)
        prompt = len(body["input_ids"])
        self.load.served(prompt)
        sent_at = last_at = time.monotonic()
        attempt = object()
        self._no_first_token[attempt] = (sent_at, prompt)
        seen = 0
        try:
            async with self._session.post(self.config.http_url + "/generate", json=body, headers=headers) as resp:
                if resp.status != 200:
                    return self._chunk_error(submit.rid, parse_error_body(resp.status, await resp.read()))
                async for raw in resp.content:
                    chunk = parse_line(raw)
                    if chunk is None:
                        continue
                    if chunk.error_status is not None:
                        return self._chunk_error(submit.rid, chunk)
                    new = chunk.token_ids  # the agent's streams are deltas
                    now = time.monotonic()
                    if new and seen == 0:
                        self._no_first_token.pop(attempt, None)
                        self.load.first_token(now - sent_at, prompt, prefill_s_per_token(self.engine_status()))
                    elif new:
                        self.load.decoded(now - last_at, len(new))
                    if new:
                        last_at = now
                        seen += len(new)
                        self.load.served(len(new))
                    if chunk.finish is not None:
                        return self._token_chunk(submit.rid, new, resumed + seen, chunk)
                    if new:
                        await self._send(self._token_chunk(submit.rid, new, resumed + seen, chunk))
            return self._error(submit.rid, 502, "the worker's stream ended without a final chunk")
        finally:
            self._no_first_token.pop(attempt, None)

    def _token_chunk(self, rid: str, new: list[int], total: int, chunk: Chunk) -> TokenChunk:
        done = chunk.finish is not None
        return TokenChunk(
            rid=rid,
            worker_id=self.config.worker_id,
            token_ids=tuple(new),
            completion_tokens=total,
            finish_reason=chunk.finish,
            meta=chunk.meta if done else None,
        )

    def _chunk_error(self, rid: str, chunk: Chunk) -> RequestError:
        shed = None if chunk.shed is None else chunk.shed.fields()
        return self._error(rid, chunk.error_status or 502, chunk.error_message, shed)

    def _draining_error(self, rid: str) -> RequestError:
        drain = self.engine_status().get("queue_drain_s")
        wait = float(drain) if isinstance(drain, (int, float)) else None
        shed = Shed(DRAINING, retry_after_s(wait))
        return self._error(rid, 503, shed.message, shed.fields())

    def _error(self, rid: str, status: int, message: str, shed: dict[str, Any] | None = None) -> RequestError:
        status = status if 400 <= status < 600 else 502
        return RequestError(rid=rid, worker_id=self.config.worker_id, status=status, message=message, shed=shed)

    async def _fetch(self, fetch: Fetch) -> None:
        """The worker's own HTTP answer to a router's Fetch (model info, cache flush)."""
        assert self._session is not None
        try:
            async with self._session.request(fetch.method, self.config.http_url + fetch.path) as resp:
                text = (await resp.content.read(MAX_FETCH_BODY)).decode(errors="replace")
                status, ctype = resp.status, resp.headers.get("content-type", "application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            status, ctype, text = 502, "text/plain", f"{type(exc).__name__}: {exc}"
        await self._send(
            FetchReply(
                worker_id=self.config.worker_id, fetch_id=fetch.fetch_id, status=status, content_type=ctype, body=text
            )
        )

    async def hand_back(self) -> None:
        """Draining ran out of time: every request still here goes back to the router (503
        draining, which it places elsewhere, resuming from the tokens already streamed)."""
        await self._end_all(quiet=False)

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
