"""The worker side of the router protocol: a worker's link to the router.

Runs inside the worker's HTTP process (a daemon thread with its own event loop), so it lives and
dies with the server: a killed worker stops heartbeating and the router fails its requests over.
It registers (GPU kind, KV capacity, batch cap), heartbeats, reports load, and runs each Submit
through the worker's own HTTP `/generate`, so routed requests take exactly the path a direct
client's would (SLO parsing, the SLO scheduler, reports). Tokens go back as TokenChunks whose
`completion_tokens` count resumed tokens too (the dispatcher's resume convention).

Load reports are the black-box estimates GoodServe and PolyServe route on:
- queue_delay_s (q_g, GoodServe's AVGWAITTIME): the larger of the EMA of finished waits
  (time-to-first-token here minus the prompt's prefill time) and the mean wait so far of the
  requests still waiting for their first token. Finished waits alone lag a growing queue by
  the very delay they measure, and a router reading them keeps sending work to a worker that
  is already falling behind. The EMA decays while nothing waits, so an idle worker never looks
  busy from an old burst;
- prefill_s_per_token (p_g): the scheduler's perf model (profiled, or learned from its steps);
- decode_s_per_token (d_g): EMA of the gap per token between a request's streamed chunks;
- iteration_s: scheduler time per step over the last report interval.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import zmq
import zmq.asyncio

from router.protocol import (
    Abort,
    Ack,
    Heartbeat,
    LoadReport,
    Register,
    RequestError,
    Shutdown,
    Submit,
    TokenChunk,
    hash_api_key,
)
from router.transport import CurveKeys, WorkerEndpoint
from wire import AGENT_TOKEN_HEADER, ARRIVAL_HEADER, REGISTER_AGAIN

logger = logging.getLogger(__name__)

REGISTER_RETRY_S = 1.0  # until the router answers (it may start after the worker)
REFUSED_RETRY_S = 5.0  # the router refused us (wrong api key): keep trying, loudly
EMA_WEIGHT = 0.2
IDLE_DECAY = 0.5  # per report while the worker's queue is empty
TPM_WINDOW_S = 60.0


@dataclass(frozen=True)
class AgentConfig:
    router_address: str
    worker_id: str
    gpu: str
    model: str  # the model path: the router loads its tokenizer from it
    http_url: str  # this worker's own HTTP server, as the agent calls it
    api_key: str | None = None
    agent_token: str | None = None  # lets the middleware trust our forwarded arrival times
    allow_remote: bool = False
    heartbeat_s: float = 0.5
    report_s: float = 0.25
    role: str = "mixed"  # "prefill" / "decode" under PD disaggregation
    bootstrap_port: int | None = None  # a prefill worker's KV bootstrap port
    tier_ms: float | None = None  # the TPOT tier it starts in
    time_scale: float = 1.0  # --emulate-slowdown of an emulated GPU
    advertised_url: str | None = None  # where the router reaches it (default http_url; a wildcard host:
    # the router fills in where the connection comes from)
    curve: CurveKeys | None = None  # encrypts the link to the router


class Ema:
    def __init__(self, weight: float = EMA_WEIGHT) -> None:
        self.weight = weight
        self.value: float | None = None

    def add(self, sample: float) -> None:
        self.value = sample if self.value is None else (1 - self.weight) * self.value + self.weight * sample

    def get(self, default: float = 0.0) -> float:
        return default if self.value is None else self.value


class LoadEstimator:
    """Turns what the agent observes plus the scheduler's snapshot into a LoadReport's numbers."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.queue_delay = Ema()
        self.decode = Ema()
        self.iteration = Ema()
        self._tokens: deque[tuple[float, int]] = deque()
        self._last_steps: tuple[float, int] | None = None

    def served(self, tokens: int) -> None:
        self._tokens.append((self.clock(), tokens))

    def first_token(self, waited_s: float, prompt_tokens: int, prefill_s_per_token: float) -> None:
        self.queue_delay.add(queued_s(waited_s, prompt_tokens, prefill_s_per_token))

    def decoded(self, gap_s: float, tokens: int) -> None:
        if tokens > 0 and gap_s >= 0:
            self.decode.add(gap_s / tokens)

    def report_fields(self, engine: dict[str, Any], still_waiting: Sequence[float] = ()) -> dict[str, Any]:
        """`still_waiting`: how long each request without a first token has queued so far."""
        now = self.clock()
        steps, stamp = engine.get("steps"), engine.get("time")
        if isinstance(steps, int) and isinstance(stamp, (int, float)):
            if self._last_steps is not None and steps > self._last_steps[1] and stamp > self._last_steps[0]:
                self.iteration.add((stamp - self._last_steps[0]) / (steps - self._last_steps[1]))
            self._last_steps = (stamp, steps)
        waiting = int(engine.get("waiting") or 0)
        if waiting == 0 and not still_waiting and self.queue_delay.value is not None:
            self.queue_delay.value *= IDLE_DECAY
        current = sum(still_waiting) / len(still_waiting) if still_waiting else 0.0
        while self._tokens and now - self._tokens[0][0] > TPM_WINDOW_S:
            self._tokens.popleft()
        predicted = (engine.get("perf_model") or {}).get("predicted_decode_ms") or {}
        decode_default = float(predicted.get("1", 0.0)) / 1000.0
        return {
            "queue_len": waiting,
            "running": int(engine.get("running") or 0),
            "kv_used_tokens": int(engine.get("kv_used_tokens") or 0),
            "queue_delay_s": max(self.queue_delay.get(), current),
            "prefill_s_per_token": prefill_s_per_token(engine),
            "decode_s_per_token": self.decode.get(decode_default),
            "iteration_s": self.iteration.get(decode_default),
            "tokens_per_minute": float(sum(n for _, n in self._tokens)),
        }


def queued_s(waited_s: float, prompt_tokens: int, prefill_s_per_token: float) -> float:
    """The part of a wait that was queueing rather than the prompt's own prefill."""
    return max(0.0, waited_s - prompt_tokens * prefill_s_per_token)


def prefill_s_per_token(engine: dict[str, Any]) -> float:
    value = engine.get("prefill_ms_per_token")
    return float(value) / 1000.0 if isinstance(value, (int, float)) and value >= 0 else 0.0


class WorkerAgent:
    """One connection to the router; `run()` until cancelled."""

    def __init__(self, config: AgentConfig, engine_status: Callable[[], dict[str, Any]]) -> None:
        self.config = config
        self.engine_status = engine_status
        self.load = LoadEstimator()
        self.registered = False
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._attempt = itertools.count()
        self._seq = itertools.count()
        self._endpoint: WorkerEndpoint | None = None
        self._session: aiohttp.ClientSession | None = None
        self._register_sent = 0.0
        self._refused = False
        self._no_first_token: dict[object, tuple[float, int]] = {}  # run -> (sent at, prompt tokens)
        self.incarnation = secrets.token_hex(8)

    # --- lifecycle ---

    async def run(self) -> None:
        ctx = zmq.asyncio.Context()
        self._endpoint = WorkerEndpoint(
            self.config.router_address,
            self.config.worker_id,
            allow_remote=self.config.allow_remote,
            ctx=ctx,
            curve=self.config.curve,
        )
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        self._session = aiohttp.ClientSession(
            headers=headers, timeout=aiohttp.ClientTimeout(total=None, sock_connect=10)
        )
        try:
            await self._wait_for_engine()
            await self._register()
            await asyncio.gather(self._receive_loop(), self._heartbeat_loop(), self._report_loop())
        finally:
            for task in list(self._tasks.values()):
                task.cancel()
            await asyncio.gather(*self._tasks.values(), return_exceptions=True)
            await self._session.close()
            self._endpoint.close()
            ctx.term()

    async def _wait_for_engine(self) -> None:
        """Register only once the server answers and the scheduler has published its capacity."""
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
        return Register(
            worker_id=self.config.worker_id,
            gpu=self.config.gpu,
            model=self.config.model,
            kv_capacity_tokens=max(1, int(engine.get("kv_capacity_tokens") or 1)),
            max_running=max(1, int(engine.get("max_running_requests") or 1)),
            http_url=self.config.advertised_url or self.config.http_url,
            api_key_hash=hash_api_key(self.config.api_key) if self.config.api_key else None,
            incarnation=self.incarnation,
            role=self.config.role,
            bootstrap_port=self.config.bootstrap_port,
            tier_ms=self.config.tier_ms,
            time_scale=self.config.time_scale,
        )

    async def _register(self) -> None:
        self._register_sent = time.monotonic()
        await self._send(self._registration())

    # --- messages from the router ---

    async def _receive_loop(self) -> None:
        assert self._endpoint is not None
        while True:
            msg = await self._endpoint.recv()
            if isinstance(msg, Ack):
                self._on_ack(msg)
                if msg.reason == REGISTER_AGAIN:  # it lost us (a stall, or it restarted)
                    await self._register()
            elif isinstance(msg, Submit):
                self._start(msg)
            elif isinstance(msg, Abort):
                task = self._tasks.pop(msg.rid, None)
                if task is not None:
                    task.cancel()  # closing the HTTP stream makes SGLang abort the request
            elif isinstance(msg, Shutdown):
                logger.info("router asked worker %s to leave", self.config.worker_id)
                return

    def _on_ack(self, ack: Ack) -> None:
        if ack.accepted:
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
            if self.registered:
                await self._send(Heartbeat(worker_id=self.config.worker_id, seq=next(self._seq)))
                continue
            retry = REFUSED_RETRY_S if self._refused else REGISTER_RETRY_S
            if time.monotonic() - self._register_sent >= retry:
                await self._register()

    async def _report_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.report_s)
            engine = self.engine_status()
            now, per_token = time.monotonic(), prefill_s_per_token(engine)
            waits = [queued_s(now - sent, prompt, per_token) for sent, prompt in self._no_first_token.values()]
            fields = self.load.report_fields(engine, waits)
            if self.registered:
                await self._send(LoadReport(worker_id=self.config.worker_id, seq=next(self._seq), **fields))

    # --- requests ---

    def _start(self, submit: Submit) -> None:
        old = self._tasks.pop(submit.rid, None)
        if old is not None:  # the router re-placed it here: the old run is stale
            old.cancel()
        task = asyncio.create_task(self._serve(submit))
        self._tasks[submit.rid] = task
        task.add_done_callback(
            lambda t, rid=submit.rid: self._tasks.pop(rid, None) if self._tasks.get(rid) is t else None
        )

    async def _serve(self, submit: Submit) -> None:
        """Stream one request from the local server back to the router."""
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
        if submit.arrival_unix is not None and self.config.agent_token is not None:
            headers = {ARRIVAL_HEADER: repr(submit.arrival_unix), AGENT_TOKEN_HEADER: self.config.agent_token}
        prompt = len(body["input_ids"])
        self.load.served(prompt)
        sent_at = last_at = time.monotonic()
        attempt = object()
        self._no_first_token[attempt] = (sent_at, prompt)
        seen = 0
        try:
            async with self._session.post(self.config.http_url + "/generate", json=body, headers=headers) as resp:
                if resp.status != 200:
                    await self._error(submit.rid, resp.status, (await resp.text())[:500])
                    return
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    chunk = orjson.loads(line[6:])
                    if "error" in chunk:
                        err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
                        await self._error(submit.rid, int(err.get("code") or 500), str(err.get("message")))
                        return
                    meta = chunk.get("meta_info") or {}
                    ids = chunk.get("output_ids") or []  # cumulative in SGLang's default stream
                    new = ids[seen:]
                    now = time.monotonic()
                    if new and seen == 0:
                        self._no_first_token.pop(attempt, None)
                        self.load.first_token(now - sent_at, prompt, prefill_s_per_token(self.engine_status()))
                    elif new:
                        self.load.decoded(now - last_at, len(new))
                    if new:
                        last_at = now
                        seen = len(ids)
                        self.load.served(len(new))
                    finish = meta.get("finish_reason")
                    if isinstance(finish, dict) and finish.get("type") == "abort":
                        status = int(finish.get("status_code") or 503)
                        await self._error(submit.rid, status if 400 <= status < 600 else 503, str(finish))
                        return
                    if not new and finish is None:
                        continue
                    reason = None if finish is None else str(finish.get("type") if isinstance(finish, dict) else finish)
                    await self._send(
                        TokenChunk(
                            rid=submit.rid,
                            worker_id=self.config.worker_id,
                            token_ids=new,
                            completion_tokens=resumed + seen,
                            finish_reason=reason,
                            meta=meta if reason is not None else None,
                        )
                    )
                    if reason is not None:
                        return
            await self._error(submit.rid, 502, "the worker's stream ended without a final chunk")
        except asyncio.CancelledError:
            raise
        except (aiohttp.ClientError, ValueError) as exc:
            await self._error(submit.rid, 502, f"{type(exc).__name__}: {exc}")
        finally:
            self._no_first_token.pop(attempt, None)

    async def _error(self, rid: str, status: int, message: str) -> None:
        status = status if 400 <= status < 600 else 502
        await self._send(RequestError(rid=rid, worker_id=self.config.worker_id, status=status, message=message))

    async def _send(self, msg: Any) -> None:
        assert self._endpoint is not None
        try:
            await self._endpoint.send(msg)
        except zmq.ZMQError as exc:  # the router is down or restarting: perishable messages are dropped
            level = logging.WARNING if isinstance(msg, (TokenChunk, RequestError)) else logging.DEBUG
            logger.log(level, "worker %s could not send %s: %s", self.config.worker_id, msg.TYPE, exc)


def start_agent_thread(config: AgentConfig, engine_status: Callable[[], dict[str, Any]]) -> threading.Thread:
    """Run the agent on its own event loop in a daemon thread (it ends with the process)."""

    def main() -> None:
        try:
            asyncio.run(WorkerAgent(config, engine_status).run())
        except Exception:  # noqa: BLE001 - the server keeps serving direct clients
            logger.exception("router agent of worker %s stopped", config.worker_id)

    thread = threading.Thread(target=main, name="slo-router-agent", daemon=True)
    thread.start()
    return thread
