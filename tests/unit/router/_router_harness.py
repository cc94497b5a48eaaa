"""A real RouterService (dispatcher, ZMQ endpoint, registry) behind its ASGI app, with scripted
fake workers on zmq.asyncio DEALER sockets and a fake of the workers' own HTTP servers.

A scripted worker answers every Submit with the same output script (like greedy decoding of one
model), `chunk` tokens per TokenChunk, following the resume convention (it continues after
`resume_output_ids` and counts them in completion_tokens), and ends with an SGLang-like final
meta_info. The tiny model's tokenizer (vocab 512, byte-level BPE, a chat template) is loaded once
per test session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx
import orjson
import zmq.asyncio

from router.http_api import create_app
from router.protocol import Fetch, FetchReply, Register, RequestError, Submit, TokenChunk
from router.service import RouterConfig, RouterService
from router.tokenizer import RouterTokenizer, load_hf_tokenizer
from tests.unit.router._fake_worker import FakeWorkerBase

TEST_TIMEOUT_S = 20.0
DEAD_AFTER_S = 0.6
SCRIPT_TEXT = " Hello wörld, 日本語 ok."  # multi-byte characters split across byte-level tokens


@functools.cache
def tiny_path() -> str:
    from server.models import ensure_tiny_model

    return str(ensure_tiny_model())


@functools.cache
def tiny_hf() -> Any:
    return load_hf_tokenizer(tiny_path())


def script_ids() -> list[int]:
    return list(tiny_hf().encode(SCRIPT_TEXT, add_special_tokens=False))


def run(test: Callable[[], Awaitable[None]], timeout_s: float = TEST_TIMEOUT_S) -> None:
    asyncio.run(asyncio.wait_for(test(), timeout_s))


class ScriptedWorker(FakeWorkerBase):
    """A worker agent stand-in that streams a fixed token script; switches make it fail."""

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        address: str,
        worker_id: str,
        *,
        script: Sequence[int] | None = None,
        chunk: int = 2,
        delay_s: float = 0.01,
        heartbeat_s: float = 0.2,
        secret: bytes | None = None,
        http: FakeWorkerHttp | None = None,  # its own HTTP server, for Fetches
        error_status: int | None = None,  # answer every Submit with this RequestError
        error_after: int | None = None,  # ... after streaming this many chunks
        stop: Any = None,  # finish as SGLang's "stop" with this `matched` after the script
        meta: dict[str, Any] | None = None,  # extra final meta_info keys
        max_input_tokens: int | None = None,  # the longest prompt its model takes
    ) -> None:
        super().__init__(
            ctx, address, worker_id, delay_s=delay_s, heartbeat_s=heartbeat_s, error_status=error_status, secret=secret
        )
        self.http = http
        self.script = list(script if script is not None else script_ids())
        self.chunk = chunk
        self.error_after = error_after
        self.stop_matched = stop
        self.meta = meta or {}
        self.max_input_tokens = max_input_tokens

    def register_message(self) -> Register:
        return Register(
            worker_id=self.worker_id,
            gpu="cpu",
            model=tiny_path(),
            kv_capacity_tokens=4096,
            max_running=8,
            http_url=f"http://{self.worker_id}.test",
            incarnation="1",
            max_input_tokens=self.max_input_tokens,
        )

    def on_fetch(self, fetch: Fetch) -> FetchReply:
        if self.http is None:
            return super().on_fetch(fetch)
        resp = self.http.handler(httpx.Request(fetch.method, f"http://{self.worker_id}.test{fetch.path}"))
        return FetchReply(
            worker_id=self.worker_id,
            fetch_id=fetch.fetch_id,
            status=resp.status_code,
            content_type=resp.headers.get("content-type", "text/plain"),
            body=resp.text,
        )

    async def _stream(self, submit: Submit) -> None:
        await asyncio.sleep(self.delay_s)
        if self.error_status is not None and self.error_after is None:
            await self._error(submit, '{"error": {"message": "The input is too long."}}')
            return
        resumed = len(submit.resume_output_ids)
        cap = submit.sampling_params.get("max_new_tokens")
        total = len(self.script) if cap is None else min(len(self.script), resumed + cap)
        pos, chunks = resumed, 0
        while True:
            if submit.rid in self.aborts:
                return
            if self.error_after is not None and chunks >= self.error_after:
                await self._error(submit, "worker gave up")
                return
            end = min(pos + self.chunk, total)
            last = end >= total
            reason = None
            meta = None
            if last:
                kind = "stop" if self.stop_matched is not None and end == len(self.script) else "length"
                finish: dict[str, Any] = {"type": kind}
                if kind == "stop":
                    finish["matched"] = self.stop_matched
                else:
                    finish["length"] = cap
                reason = kind
                meta = {
                    "id": f"{submit.rid}#1",
                    "finish_reason": finish,
                    "prompt_tokens": len(submit.input_ids) + resumed,
                    "completion_tokens": end - resumed,
                    "cached_tokens": 3,
                    "e2e_latency": 0.01,
                    "weight_version": "default",
                    "slo": {"tier": "admitted", "from": self.worker_id},
                    **self.meta,
                }
            await self.endpoint.send(
                TokenChunk(
                    rid=submit.rid,
                    worker_id=self.worker_id,
                    token_ids=self.script[pos:end],
                    completion_tokens=end,
                    finish_reason=reason,
                    meta=meta,
                )
            )
            chunks += 1
            pos = end
            if last:
                return
            await asyncio.sleep(self.delay_s)

    async def _error(self, submit: Submit, message: str) -> None:
        status = self.error_status or 400
        await self.endpoint.send(RequestError(rid=submit.rid, worker_id=self.worker_id, status=status, message=message))


class FakeWorkerHttp:
    """The workers' own HTTP servers (what each answers a Fetch with)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.flush_status: dict[str, int] = {}

    def handler(self, request: httpx.Request) -> httpx.Response:
        host, path = request.url.host, request.url.path
        self.calls.append((request.method, f"{host}{path}"))
        worker = host.removesuffix(".test")
        if path == "/model_info":
            return httpx.Response(
                200, json={"model_path": tiny_path(), "tokenizer_path": tiny_path(), "is_generation": True}
            )
        if path == "/server_info":
            return httpx.Response(200, json={"model_path": tiny_path(), "internal_states": [{"worker": worker}]})
        if path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": tiny_path(), "object": "model"}]})
        if path == "/flush_cache":
            status = self.flush_status.get(worker, 200)
            return httpx.Response(status, text="Cache flushed.\n" if status == 200 else "busy")
        return httpx.Response(404, json={"detail": "Not Found"})


class Harness:
    def __init__(self, service: RouterService, client: httpx.AsyncClient, app: Any, http: FakeWorkerHttp) -> None:
        self.service = service
        self.client = client
        self.app = app
        self.http = http
        self.workers: list[ScriptedWorker] = []

    async def add_worker(self, ctx: zmq.asyncio.Context, worker_id: str, **kw: Any) -> ScriptedWorker:
        wait = kw.pop("wait", True)
        kw.setdefault("http", self.http)
        kw.setdefault("secret", self.service.config.worker_secret)
        worker = ScriptedWorker(ctx, self.service.worker_address, worker_id, **kw)
        self.workers.append(worker)
        await worker.start(wait=wait)
        return worker


@contextlib.asynccontextmanager
async def router(
    ctx: zmq.asyncio.Context,
    workers: Sequence[dict[str, Any]] = ({},),
    tokenizer: RouterTokenizer | None = None,
    **config_kw: Any,
) -> AsyncIterator[Harness]:
    """A started router with the given scripted workers (w0, w1, ...), all torn down after."""
    config_kw.setdefault("routing_policy", "round_robin")
    config_kw.setdefault("migrate_interval_s", None)
    config = RouterConfig(
        worker_bind="tcp://127.0.0.1:0",
        dead_after_s=DEAD_AFTER_S,
        reap_interval_s=0.05,
        admission_timeout_s=config_kw.pop("admission_timeout_s", 0.5),
        **config_kw,
    )
    http = FakeWorkerHttp()
    service = RouterService(
        config,
        ctx=ctx,
        tokenizer=tokenizer if tokenizer is not None else RouterTokenizer(tiny_path(), tokenizer=tiny_hf()),
    )
    await service.start()
    app = create_app(service, lifespan=False)
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router", headers=headers)
    harness = Harness(service, client, app, http)
    try:
        for i, spec in enumerate(workers):
            spec = dict(spec)
            await harness.add_worker(ctx, spec.pop("worker_id", f"w{i}"), **spec)
        yield harness
    finally:
        for worker in harness.workers:
            await worker.stop()
        await client.aclose()
        await service.stop()


def sse_events(body: bytes) -> list[Any]:
    """The JSON events of an SSE body, with "[DONE]" kept as the string."""
    out: list[Any] = []
    for block in body.split(b"\n\n"):
        if not block.strip():
            continue
        assert block.startswith(b"data: "), block
        payload = block[len(b"data: ") :]
        out.append("[DONE]" if payload == b"[DONE]" else orjson.loads(payload))
    return out


def assert_refused_before_any_worker(ctx: zmq.asyncio.Context, path: str, body: dict[str, Any], field: str) -> None:
    """The router answers `body` on `path` with a 400 naming `field`, and no worker sees it."""

    async def go() -> None:
        async with router(ctx) as h:
            resp = await h.client.post(path, json=body)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["param"] == field
            assert h.workers[0].submits == []

    run(go)
