"""The router's requests on a worker: the request half of the worker agent (server/worker_agent.py
keeps the link: registration, heartbeats, load reports).

Each Submit runs through the worker's own HTTP `/generate`, so a routed request takes exactly the
path a direct client's would (SLO parsing, the SLO scheduler, reports). Tokens go back as
TokenChunks whose `completion_tokens` count resumed tokens too (the dispatcher's resume
convention). Every Submit gets exactly one final message: its last TokenChunk, or a RequestError
however its run ends (an error, a crash in this code, a drain handing it back), unless the router
itself cancelled it. The stream's timings feed the load estimates the agent reports.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from router.protocol import Fetch, FetchReply, RequestError, Submit, TokenChunk
from scheduler.core.admission import retry_after_s
from scheduler.core.shed_wire import Shed
from server.agent_config import AgentConfig
from server.agent_load import LoadEstimator, prefill_s_per_token, queued_s
from server.agent_stream import Chunk, parse_error_body, parse_line
from server.draining import Drain
from wire import AGENT_TOKEN_HEADER, ARRIVAL_HEADER, DRAINING

logger = logging.getLogger(__name__)

READ_BUFSIZE = 1 << 20  # a stream line may be long (a final chunk's meta_info)
MAX_FETCH_BODY = 1 << 20


class AgentRequests:
    """The requests the router placed here, each a task streaming from the local server; `send`
    puts a message on the link to the router."""

    def __init__(
        self,
        config: AgentConfig,
        engine_status: Callable[[], dict[str, Any]],
        drain: Drain,
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.config = config
        self.engine_status = engine_status
        self.drain = drain
        self.send = send
        self.load = LoadEstimator()
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._quiet: set[asyncio.Task[None]] = set()  # cancelled by the router: no final message owed
        self._attempt = itertools.count()
        self._no_first_token: dict[object, tuple[float, int]] = {}  # run -> (sent at, prompt tokens)
        self._session: aiohttp.ClientSession | None = None

    # --- the local server ---

    def open(self) -> None:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        # No connection limit: every routed request must reach the SLO scheduler's own queue
        # (its order and admission), not wait FIFO in the client.
        self._session = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            connector=aiohttp.TCPConnector(limit=0),
            read_bufsize=READ_BUFSIZE,
        )

    async def close(self) -> None:
        """End every run quietly (the link is going away), then the client."""
        await self.end_all(quiet=True)
        if self._session is not None:
            await self._session.close()

    async def server_answers(self) -> bool:
        assert self._session is not None
        try:
            async with self._session.get(self.config.http_url + "/health") as resp:
                return resp.status == 200
        except aiohttp.ClientError:
            return False

    # --- what the agent reports ---

    def load_fields(self, engine: dict[str, Any]) -> dict[str, Any]:
        """The load estimates, counting the requests still waiting for their first token."""
        now, per_token = time.monotonic(), prefill_s_per_token(engine)
        waits = [queued_s(now - sent, prompt, per_token) for sent, prompt in self._no_first_token.values()]
        return self.load.report_fields(engine, waits)

    # --- the router's orders ---

    def start(self, submit: Submit) -> None:
        self.cancel(submit.rid)  # the router re-placed it here: the old run is stale
        task = asyncio.create_task(self._serve(submit))
        self.tasks[submit.rid] = task
        task.add_done_callback(lambda t, rid=submit.rid: self._done(rid, t))

    def _done(self, rid: str, task: asyncio.Task[None]) -> None:
        if self.tasks.get(rid) is task:
            del self.tasks[rid]
        self._quiet.discard(task)

    def cancel(self, rid: str) -> None:
        """The router withdrew it (an Abort, or a new placement): it expects no answer."""
        task = self.tasks.pop(rid, None)
        if task is not None:
            self._quiet.add(task)
            task.cancel()

    async def end_all(self, quiet: bool) -> None:
        tasks = list(self.tasks.values())
        if quiet:
            self._quiet.update(tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # --- one request's run ---

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
                await self.send(final)

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
            body["slo"] = submit.slo.to_dict()
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
                        await self.send(self._token_chunk(submit.rid, new, resumed + seen, chunk))
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

    async def fetch(self, fetch: Fetch) -> None:
        """The worker's own HTTP answer to a router's Fetch (model info, cache flush)."""
        assert self._session is not None
        try:
            async with self._session.request(fetch.method, self.config.http_url + fetch.path) as resp:
                text = (await resp.content.read(MAX_FETCH_BODY)).decode(errors="replace")
                status, ctype = resp.status, resp.headers.get("content-type", "application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            status, ctype, text = 502, "text/plain", f"{type(exc).__name__}: {exc}"
        await self.send(
            FetchReply(
                worker_id=self.config.worker_id, fetch_id=fetch.fetch_id, status=status, content_type=ctype, body=text
            )
        )
