"""HTTP edge of SLO serving, as plain ASGI middleware in front of SGLang's app.

In, on every route that generates (POST and PUT /generate, /vertex_generate, the OpenAI routes
and SageMaker's /invocations): parses and validates the SLO (400 naming the field), strips the
internal keys a client must not set (`slo_*` in custom_params: the arrival stamp and the
scheduler's own fields) unless the router's agent sent the request, stamps the arrival time and
injects both into SGLang's custom_params. Out: adds the `slo` report block to OpenAI responses
(native responses get it in meta_info from the tokenizer manager), answers a request the
scheduler shed with the shed's status (429/503), Retry-After and reason, serves GET /slo/status,
and appends the SLO counters to GET /metrics. While draining (graceful shutdown) it answers new
generation requests 503 `draining` and /health 503.

With keys configured it is also the worker's key check (server/worker_access.py says why here):
every route is answered 401/403 unless the caller's key has the route's role, the caller's
Principal goes into the ASGI scope, and /server_info leaves without SGLang's keys. It opens
`x-body-compressed` bodies itself (server/compressed_body.py) so no check is skipped on them.

The benchmark-only true-length hint (`slo_oracle_output_len`) is kept from any client: it also
ends the request at that length, so a hint that flatters a request only cuts its own answer.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from router.access import OPEN_ACCESS, PRINCIPAL_SCOPE_KEY
from scheduler.core.admission import retry_after_s
from scheduler.core.field_error import FieldError
from scheduler.core.json_depth import unforwardable
from scheduler.core.regex_guard import UnsafeRegex, check_stop_regex
from scheduler.core.sampling_guard import BadParam, check_generate_fields
from scheduler.core.shed_wire import Shed
from scheduler.core.slo import SloSpec, SloValidationError
from scheduler.core.slo_limits import SloLimitError, hold_to_key
from scheduler.core.slo_wire import extract_slo, inject_native, inject_openai
from scheduler.reporting.reports import SloReportBook
from server import compressed_body, request_context
from server.asgi_io import (
    Receive,
    Scope,
    Send,
    capture_response,
    error_body,
    read_body,
    replay_body,
    respond,
    respond_shed,
    with_length,
)
from server.draining import Drain
from server.engine_metrics import engine_exposition
from server.spec_metrics import speculation_exposition
from server.worker_access import WorkerAccess, scrub_secrets
from wire import AGENT_TOKEN_HEADER, ARRIVAL_HEADER, DRAINING, INTERNAL_PARAM_PREFIX, ORACLE_HINT_PARAM

NATIVE, OPENAI, VERTEX = "native", "openai", "vertex"
# Every route that generates, by how its body carries sampling parameters.
GENERATE_ROUTES: dict[tuple[str, str], str] = {
    ("POST", "/generate"): NATIVE,
    ("PUT", "/generate"): NATIVE,
    ("POST", "/v1/completions"): OPENAI,
    ("POST", "/v1/chat/completions"): OPENAI,
    ("POST", "/invocations"): OPENAI,  # SageMaker: SGLang's chat completions
    ("POST", os.environ.get("AIP_PREDICT_ROUTE", "/vertex_generate")): VERTEX,
}
NATIVE_PATHS = frozenset({"/generate"})
OPENAI_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/invocations"})
MAX_BODY_BYTES = 64 * 1024 * 1024
# The router's worker agent forwards the client's arrival time, so the worker's deadlines count
# from when the client asked, not from when the request reached this worker (or resumed here).
# Only trusted with the agent's per-process token: a client must not back-date its requests.
MAX_FORWARDED_AGE_S = 3600.0


def strip_internal(params: Any) -> None:
    """Remove the internal keys a client set in custom_params (the oracle hint stays)."""
    custom = params.get("custom_params") if isinstance(params, dict) else None
    if isinstance(custom, dict):
        for key in [k for k in custom if isinstance(k, str) and k.startswith(INTERNAL_PARAM_PREFIX)]:
            if key != ORACLE_HINT_PARAM:
                del custom[key]


def _strip_body(body: dict[str, Any], kind: str) -> None:
    if kind == OPENAI:
        strip_internal(body)
        return
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        strip_internal(p)


def _add_custom(body: dict[str, Any], kind: str, extra: dict[str, Any]) -> None:
    """`extra` into every custom_params of the body (inject_* made them)."""
    if not extra:
        return
    params = body if kind == OPENAI else body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict) and isinstance(p.get("custom_params"), dict):
            p["custom_params"].update(extra)


def unsafe_stop_regex(target: dict[str, Any], kind: str) -> UnsafeRegex | None:
    """SGLang runs stop patterns inside its scheduler loop: refuse the ones whose matching cost
    is not bounded (scheduler.core.regex_guard), naming the field."""
    if kind == OPENAI:
        found = [("stop_regex", target.get("stop_regex"))]
    else:
        params = target.get("sampling_params")
        many = isinstance(params, list)
        found = [
            (f"sampling_params{f'[{i}]' if many else ''}.stop_regex", p.get("stop_regex"))
            for i, p in enumerate(params if many else [params])
            if isinstance(p, dict)
        ]
    try:
        for field, value in found:
            check_stop_regex(value, field)
    except UnsafeRegex as exc:
        return exc
    return None


class SloMiddleware:
    def __init__(
        self,
        app: Callable[[Scope, Receive, Send], Awaitable[None]],
        book: SloReportBook,
        default_slo: SloSpec | None,
        status: Callable[[], dict[str, Any]],
        agent_token: str | None = None,
        drain: Drain | None = None,
        on_started: Callable[[], None] | None = None,
        vertex_fields: frozenset[str] | None = None,
        access: WorkerAccess | None = None,
        decompression: bool = False,
        contract: Callable[[dict[str, Any]], FieldError | None] | None = None,
    ) -> None:
        self.app = app
        # SGLang's own /generate contract check, run here first: SGLang answers a violation with a
        # bare-string error that names no field; this one names it. None: not checked here.
        self.contract = contract
        self.access = access  # None: no key check here (SGLang's own, or none)
        self.decompression = decompression  # SGLANG_ENABLE_REQUEST_DECOMPRESSION: open bodies here
        # SGLang spreads a Vertex body's "parameters" into GenerateReqInput(**parameters): a name
        # it does not know is a TypeError there (a 500), so it is a 400 here. None: not checked.
        self.vertex_fields = vertex_fields
        self.book = book
        self.default_slo = default_slo
        self.status = status
        self.agent_token = agent_token
        self.drain = drain if drain is not None else Drain()
        self.on_started = on_started  # once the server is up (signal handlers installed by then)

    @property
    def draining(self) -> bool:
        return self.drain.active

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan" and self.on_started is not None:
            return await self.app(scope, receive, self._lifespan_send(send))
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        if self.access is not None:
            admitted = await self._admit(scope, receive, send)
            if admitted is None:
                return
            scope = admitted
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        method_name = compressed_body.compression(scope.get("headers", [])) if self.decompression else None
        if method_name is not None:
            return await self._decompressed(scope, receive, send, method_name)
        return await self._route(scope, receive, send)

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> Scope | None:
        """The scope to serve with the caller's Principal in it and SGLang's internal key in
        place of the caller's; None when the caller was refused (answered 401/403 here)."""
        assert self.access is not None
        websocket = scope["type"] == "websocket"
        authorization = next((v for k, v in scope.get("headers", []) if k.lower() == b"authorization"), None)
        verdict = self.access.check(scope.get("method", "GET"), scope["path"], authorization, websocket)
        if not verdict.allowed:
            if websocket:  # closing before accepting answers the handshake with 403
                await send({"type": "websocket.close", "code": 1008})
            else:
                await respond(send, verdict.status, error_body("authorization", verdict.message, verdict.status))
            return None
        inner = self.access.inner_authorization()
        if verdict.principal is None or inner is None:
            return scope
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"authorization"]
        return {**scope, "headers": [*headers, (b"authorization", inner)], PRINCIPAL_SCOPE_KEY: verdict.principal}

    async def _decompressed(self, scope: Scope, receive: Receive, send: Send, method_name: str) -> None:
        """Opens an `x-body-compressed` body (bounded) before any check reads it."""
        field = compressed_body.HEADER.decode()
        try:
            raw = await read_body(receive, MAX_BODY_BYTES)
            body = await asyncio.get_running_loop().run_in_executor(
                None, compressed_body.decompress, method_name, raw, MAX_BODY_BYTES
            )
        except SloValidationError as e:
            return await respond(send, 413, error_body(e.field, e.message, 413))
        except compressed_body.BodyError as e:
            return await respond(send, e.status, error_body(field, e.message, e.status))
        headers = compressed_body.without_compression(list(scope.get("headers", [])), len(body))
        await self._route({**scope, "headers": headers}, replay_body(body, receive), send)

    async def _route(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if method == "GET" and path in ("/server_info", "/get_server_info"):
            return await self._server_info(scope, receive, send)
        if method == "GET" and path == "/slo/status":
            return await respond(send, 200, orjson.dumps(self.status()))
        if method == "GET" and path == "/metrics":
            return await self._metrics(scope, receive, send)
        kind = GENERATE_ROUTES.get((method, path))
        if kind is not None:
            if self.draining:
                return await respond_shed(send, self._draining_shed())
            return await self._generate(scope, receive, send, kind)
        if self.draining and method == "GET" and path in ("/health", "/health_generate"):
            return await respond_shed(send, self._draining_shed())  # load balancers stop sending
        return await self.app(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def wrapped(message: dict[str, Any]) -> None:
            await send(message)
            if message["type"] == "lifespan.startup.complete" and self.on_started is not None:
                started, self.on_started = self.on_started, None
                started()

        return wrapped

    def _draining_shed(self) -> Shed:
        """Come back once the work still queued here has drained (what the scheduler predicts)."""
        engine = self.status().get("engine") or {}
        wait = engine.get("queue_drain_s")
        wait = float(wait) if isinstance(wait, (int, float)) and not isinstance(wait, bool) else None
        return Shed(DRAINING, retry_after_s(wait), None if wait is None else round(1000.0 * wait, 3))

    async def _generate(self, scope: Scope, receive: Receive, send: Send, kind: str) -> None:
        arrival = time.time()
        try:
            raw = await read_body(receive, MAX_BODY_BYTES)
        except SloValidationError as e:
            return await respond(send, 413, error_body(e.field, e.message, 413))
        try:
            body = orjson.loads(raw) if raw else None
        except orjson.JSONDecodeError:
            body = None
        if not isinstance(body, dict):  # not ours to judge: SGLang answers malformed bodies
            return await self.app(scope, replay_body(raw, receive), send)
        too_deep = unforwardable(body)  # it could not be handed on to SGLang (a 500 there)
        if too_deep is not None:
            return await respond(send, 400, error_body("body", too_deep))
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if not headers.get(AGENT_TOKEN_HEADER, "").isascii():
            return await respond(send, 400, error_body(AGENT_TOKEN_HEADER, "must be ASCII"))
        ctx = request_context.begin()
        ctx.from_agent = self._from_agent(headers)
        arrival = self._forwarded_arrival(headers, arrival) if ctx.from_agent else arrival
        target: Any = body
        if kind == VERTEX:  # {"instances": [...], "parameters": {GenerateReqInput fields}}
            target = body.get("parameters")
            if target is None:
                target = body["parameters"] = {}
            if not isinstance(target, dict):
                return await respond(send, 400, error_body("parameters", "must be an object"))
            unknown = sorted(set(target) - self.vertex_fields) if self.vertex_fields is not None else []
            if unknown:
                return await respond(send, 400, error_body(f"parameters.{unknown[0]}", "is not a generate field"))
        unsafe = unsafe_stop_regex(target, kind)
        if unsafe is not None:
            field = f"parameters.{unsafe.field}" if kind == VERTEX else unsafe.field
            return await respond(send, 400, error_body(field, unsafe.message))
        if kind != OPENAI:  # SGLang's OpenAI models type their fields; the tokenizer manager checks the rest
            try:
                check_generate_fields(target, prefix="parameters." if kind == VERTEX else "")
            except BadParam as e:
                return await respond(send, 400, error_body(e.field, e.message))
        refused = self.contract(target) if kind == NATIVE and self.contract is not None else None
        if refused is not None:
            return await respond(send, 400, error_body(refused.field, refused.message))
        try:
            if not ctx.from_agent:
                _strip_body(target, kind)
            # an agent's request: the agent's Submit decode validated its SLO (router/protocol.py)
            spec = extract_slo(target, headers, self.default_slo, native=kind != OPENAI, validated=ctx.from_agent)
            tenant: dict[str, Any] = {}
            principal = None if ctx.from_agent else scope.get(PRINCIPAL_SCOPE_KEY)  # the router held it already
            if principal is not None and principal is not OPEN_ACCESS:
                spec, ctx.slo_clamped = hold_to_key(spec, principal.name, principal.limits, principal.share, tenant)
            (inject_openai if kind == OPENAI else inject_native)(target, spec, arrival)
            _add_custom(target, kind, tenant)
            ctx.slo, ctx.arrival = spec, arrival
        except SloLimitError as e:
            return await respond(send, 403, error_body(e.field, e.message, 403))
        except SloValidationError as e:
            field = f"parameters.{e.field}" if kind == VERTEX and not e.field.startswith("x-slo") else e.field
            return await respond(send, 400, error_body(field, e.message))
        new_raw = orjson.dumps(body)
        scope = {**scope, "headers": with_length(list(scope.get("headers", [])), len(new_raw))}
        out = self._openai_send(send) if kind == OPENAI else send
        await self.app(scope, replay_body(new_raw, receive), self._shed_send(out, ctx))

    def _shed_send(self, send: Send, ctx: request_context.RequestContext) -> Send:
        """Answers a request the scheduler shed before anything was sent with the shed's status,
        Retry-After and body, streamed or not: a stream's headers wait for its first chunk (as
        a client sees them with its first token anyway). A stream shed after it started keeps
        its abort finish reason, which carries the same reason."""
        state: dict[str, Any] = {"start": None, "replaced": False, "started": False}

        async def wrapped(message: dict[str, Any]) -> None:
            if state["replaced"]:
                return  # the inner app's own answer: already replaced
            if message["type"] == "http.response.start" and not state["started"]:
                state["start"] = message
                return
            if message["type"] == "http.response.body" and state["start"] is not None and not state["started"]:
                if ctx.shed is not None:
                    state["replaced"] = True
                    return await respond_shed(send, ctx.shed)
                state["started"] = True
                await send(state["start"])
            await send(message)

        return wrapped

    def _from_agent(self, headers: dict[str, str]) -> bool:
        token = headers.get(AGENT_TOKEN_HEADER)
        if self.agent_token is None or token is None or not token.isascii():
            return False
        return hmac.compare_digest(token.encode(), self.agent_token.encode())

    def _forwarded_arrival(self, headers: dict[str, str], arrival: float) -> float:
        """The router's arrival time when its agent sent the request, else this server's."""
        if not self._from_agent(headers):
            return arrival
        try:
            forwarded = float(headers.get(ARRIVAL_HEADER, ""))
        except ValueError:
            return arrival
        return min(arrival, max(forwarded, arrival - MAX_FORWARDED_AGE_S)) if math.isfinite(forwarded) else arrival

    def _openai_send(self, send: Send) -> Send:
        """Adds the `slo` block to the final OpenAI JSON response or SSE chunk."""
        state: dict[str, Any] = {"start": None, "mode": None, "buffer": []}

        async def wrapped(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                ctype = dict((k.lower(), v) for k, v in message.get("headers", [])).get(b"content-type", b"")
                state["mode"] = "sse" if b"event-stream" in ctype else "json" if b"json" in ctype else None
                if state["mode"] == "json":
                    state["start"] = message
                    return
                return await send(message)
            if message["type"] != "http.response.body" or state["mode"] is None:
                return await send(message)
            if state["mode"] == "sse":
                return await send({**message, "body": self._annotate_sse(message.get("body", b""))})
            state["buffer"].append(message.get("body", b""))
            if message.get("more_body", False):
                return
            body = self._annotate_json(b"".join(state["buffer"]))
            start = state["start"]
            await send({**start, "headers": with_length(list(start.get("headers", [])), len(body))})
            await send({"type": "http.response.body", "body": body})

        return wrapped

    def _annotate(self, obj: Any, require_finish: bool) -> bool:
        if not isinstance(obj, dict) or "id" not in obj:
            return False
        if require_finish and not any(c.get("finish_reason") for c in obj.get("choices") or [] if isinstance(c, dict)):
            return False
        report = self.book.report(obj["id"])
        if report is None:
            return False
        obj["slo"] = report
        return True

    def _annotate_json(self, body: bytes) -> bytes:
        try:
            obj = orjson.loads(body)
        except orjson.JSONDecodeError:
            return body
        return orjson.dumps(obj) if self._annotate(obj, require_finish=False) else body

    def _annotate_sse(self, chunk: bytes) -> bytes:
        if b"finish_reason" not in chunk:
            return chunk
        events = chunk.split(b"\n\n")
        changed = False
        for i, event in enumerate(events):
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            try:
                obj = orjson.loads(event[len(b"data: ") :])
            except orjson.JSONDecodeError:
                continue
            if self._annotate(obj, require_finish=True):
                events[i] = b"data: " + orjson.dumps(obj)
                changed = True
        return b"\n\n".join(events) if changed else chunk

    async def _server_info(self, scope: Scope, receive: Receive, send: Send) -> None:
        """SGLang's server info without the keys in its server settings (SGLang returns them)."""
        status, _, raw = await capture_response(self.app, scope, receive)
        try:
            await respond(send, status, orjson.dumps(scrub_secrets(orjson.loads(raw))))
        except orjson.JSONDecodeError:  # not JSON: nothing of it is passed on
            await respond(send, 502, error_body("server_info", "the engine's answer is not JSON", 502))

    async def _metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        status, _, raw = await capture_response(self.app, scope, receive)
        engine = self.status().get("engine") or {}
        ours = self.book.metrics.exposition() + speculation_exposition(engine) + engine_exposition(engine)
        body = raw.rstrip(b"\n") + b"\n" + ours if status == 200 else ours
        await respond(send, 200, body, b"text/plain; version=0.0.4; charset=utf-8")
