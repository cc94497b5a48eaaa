"""The router's HTTP API: what one SGLang worker serves, in front of many.

Clients (SGLang frontend programs, `bench_serving --backend sglang`, OpenAI clients) see the
routes and response formats of SGLang 0.5.17: /generate (native; streamed `text` and
`output_ids` cumulative by default, as SGLang without --incremental-streaming-output),
/v1/completions, /v1/chat/completions, model/server info, cache flushes and health. Each
generation response also carries the router's SLO report (meta_info.slo, or the OpenAI `slo`
block) scored from the times tokens reached the router, and the workers it ran on.

Errors: a refused request is a JSON error naming its field (400), no worker is a 503, and a
worker's own error is passed through with its status while no byte was sent; once a stream has
started, an error becomes a final `data: {"error": ...}` event. A client that disconnects aborts
its request on the worker. Who may call each route (client, admin, metrics keys) is
router/http_guard.py's table.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from router import openai_format as oai
from router.access import AccessTable
from router.api_error import ApiError, bad
from router.flight import (
    NoWorkerAvailable,
    RequestStream,
    RouterQueueFull,
    StreamChunk,
    StreamError,
    StreamEvent,
)
from router.generation import Generation
from router.handover import MigrationRefused
from router.http_common import (
    SseResponse,
    caller,
    error_response,
    guarded,
    json_response,
    lower_headers,
    race_disconnect,
    read_json,
    sse,
    worker_error,
)
from router.http_guard import ROUTE_ROLES, RoleGuard, scrub_secrets
from router.protocol import ProtocolError
from router.requests import ParseContext, parse_chat, parse_completion, parse_native
from router.service import GenerateCall, PromptTooLong, RouterService
from router.tokenizer import RouterTokenizer

logger = logging.getLogger(__name__)

DONE = b"data: [DONE]\n\n"
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


# --- one generation, whatever the route ---


class Run:
    """A submitted request: its stream, its Generation, and the one cleanup path."""

    def __init__(self, stream: RequestStream, gen: Generation) -> None:
        self.stream = stream
        self.gen = gen

    async def close(self) -> None:
        """Abort on the worker unless it ended; score it as dropped unless it finished."""
        await self.stream.aclose()
        self.gen.fail()

    async def next_event(self) -> StreamEvent:
        try:
            return await self.stream.__anext__()
        except StopAsyncIteration:
            return StreamError(self.stream.rid, 502, "the request's stream ended without a final chunk")

    async def drain(self) -> StreamError | None:
        """Absorb every chunk to the end; the StreamError if it failed."""
        while True:
            event = await self.next_event()
            if isinstance(event, StreamError):
                return event
            self.gen.absorb(event)
            if event.finish_reason is not None:
                return None


async def open_run(service: RouterService, call: GenerateCall, tokenizer: RouterTokenizer) -> Run:
    try:
        stream = await service.submit(call)
    except (NoWorkerAvailable, RouterQueueFull):
        service.reports.finish(call.rid, call.slo, call.arrival_unix, (), finished=False)  # a 503 is a drop
        raise
    except ProtocolError as exc:  # what the wire format refuses (e.g. a request over its size limit)
        raise bad(exc.field, exc.reason) from None
    except PromptTooLong as exc:
        raise bad(call.prompt_field, str(exc)) from None
    except ValueError as exc:  # a rid already in flight
        raise bad("rid", str(exc)) from None
    params = call.sampling_params
    detok = tokenizer.detokenizer(
        call.input_ids,
        skip_special_tokens=params.get("skip_special_tokens", True) is not False,
        spaces_between_special_tokens=params.get("spaces_between_special_tokens", True) is not False,
    )
    generation = Generation(
        call,
        detok,
        service.reports,
        workers=lambda: stream.workers,
        prefill_workers=lambda: stream.prefill_workers,
        on_finished=service.observe_output,
    )
    return Run(stream, generation)


async def respond(
    run: Run,
    request: Request,
    stream: bool,
    final_body: Callable[[Generation], dict[str, Any]],
    events: Callable[[StreamEvent], AsyncIterator[bytes]],
) -> Response:
    """Non-streaming: the whole answer as JSON. Streaming: waits for the first event, so a
    worker's 4xx is still a real HTTP error, then streams `events` and ends with [DONE]."""
    handed_off = False
    try:
        if not stream:
            err = await race_disconnect(run.drain(), request.receive)
            if err is not None:
                raise worker_error(err)
            return json_response(final_body(run.gen))
        first = await race_disconnect(run.next_event(), request.receive)
        if isinstance(first, StreamError):
            raise worker_error(first)

        async def body() -> AsyncIterator[bytes]:
            event: StreamEvent = first
            while True:
                if isinstance(event, StreamError):
                    run.gen.fail()
                    yield sse(worker_error(event).body())
                    break
                async for piece in events(event):
                    yield piece
                if event.finish_reason is not None:
                    break
                event = await run.next_event()
            yield DONE

        handed_off = True
        return SseResponse(body(), run.close)
    finally:
        if not handed_off:
            await run.close()


# --- the app ---


def create_app(
    service: RouterService, *, lifespan: bool = True, on_started: Callable[[RouterService], None] | None = None
) -> ASGIApp:
    """The router's ASGI app. With `lifespan`, the app starts and stops `service` itself
    (uvicorn) and then calls `on_started`; tests that start the service themselves pass
    lifespan=False."""

    async def tokenizer() -> RouterTokenizer:
        return await service.ready_tokenizer()

    async def read_body(request: Request) -> tuple[dict[str, Any], ParseContext]:
        """The request's JSON body and what it is parsed against; arrival is stamped before reading."""
        arrival = (time.time(), time.monotonic())
        body = await read_json(request)
        return body, ParseContext(
            lower_headers(request), tokenizer, service.config.default_slo, arrival, caller(request)
        )

    # --- generation routes ---

    @guarded
    async def generate(request: Request) -> Response:
        call = await parse_native(*await read_body(request))
        run = await open_run(service, call, await tokenizer())
        incremental = service.config.incremental_streaming_output

        def final(gen: Generation) -> dict[str, Any]:
            return {"text": gen.text, "output_ids": list(gen.output_ids), "meta_info": gen.meta_info()}

        async def events(event: StreamEvent) -> AsyncIterator[bytes]:
            assert isinstance(event, StreamChunk)
            delta = run.gen.absorb(event)
            if incremental:
                yield sse({"text": delta, "output_ids": list(event.token_ids), "meta_info": run.gen.meta_info()})
            else:
                yield sse(final(run.gen))

        return await respond(run, request, call.stream, final, events)

    @guarded
    async def completions(request: Request) -> Response:
        call, opts = await parse_completion(*await read_body(request))
        run = await open_run(service, call, await tokenizer())
        created = int(time.time())

        async def events(event: StreamEvent) -> AsyncIterator[bytes]:
            assert isinstance(event, StreamChunk)
            delta = run.gen.absorb(event)
            if delta or event.finish_reason is not None:
                yield sse(oai.completion_chunk(run.gen, opts, created, delta))
            if event.finish_reason is not None and opts.include_usage:
                yield sse(oai.usage_chunk(run.gen, opts, created, "text_completion"))

        return await respond(run, request, call.stream, lambda g: oai.completion_response(g, opts, created), events)

    @guarded
    async def chat_completions(request: Request) -> Response:
        call, opts = await parse_chat(*await read_body(request))
        run = await open_run(service, call, await tokenizer())
        created = int(time.time())
        started = False

        async def events(event: StreamEvent) -> AsyncIterator[bytes]:
            nonlocal started
            assert isinstance(event, StreamChunk)
            if not started:
                started = True
                yield sse(oai.chat_chunk(run.gen, opts, created, role="assistant", content=""))
            delta = run.gen.absorb(event)
            if delta:
                yield sse(oai.chat_chunk(run.gen, opts, created, content=delta))
            if event.finish_reason is not None:
                yield sse(oai.chat_chunk(run.gen, opts, created, final=True))
                if opts.include_usage:
                    yield sse(oai.usage_chunk(run.gen, opts, created, "chat.completion.chunk"))

        return await respond(run, request, call.stream, lambda g: oai.chat_response(g, opts, created), events)

    # --- worker info, cache, health ---

    async def proxied(path: str) -> tuple[str, Response, Any]:
        worker_id, resp = await service.proxy.get(path)
        parsed = None
        with contextlib.suppress(ValueError):
            parsed = resp.json()
        if isinstance(parsed, dict):  # a worker's settings hold its own keys: never passed through
            parsed = scrub_secrets(parsed)
            return worker_id, json_response(parsed, resp.status_code), parsed
        media = resp.content_type or "application/json"
        return worker_id, Response(resp.content, resp.status_code, media_type=media), parsed

    @guarded
    async def model_info(request: Request) -> Response:
        return (await proxied("/model_info"))[1]

    @guarded
    async def models(request: Request) -> Response:
        return (await proxied("/v1/models"))[1]

    @guarded
    async def server_info(request: Request) -> Response:
        worker_id, resp, parsed = await proxied("/server_info")
        if resp.status_code != 200 or not isinstance(parsed, dict):
            return resp
        status = service.status()  # the worker address and requests in flight are the admin's (/slo/status)
        parsed["router"] = {
            "info_from_worker": worker_id,
            **{k: status[k] for k in ("policy", "policy_params")},
            "workers": [w["worker_id"] for w in status["workers"]],
        }
        return json_response(parsed)

    @guarded
    async def flush_cache(request: Request) -> Response:
        results = await service.proxy.flush_cache()
        failed = {wid: why for wid, why in results.items() if why != "ok"}
        if failed:
            return json_response(
                ApiError(500, f"flush failed on {', '.join(sorted(failed))}").body() | {"workers": results}, 500
            )
        return Response(f"Cache flushed on {len(results)} workers.\n", 200, media_type="text/plain")

    async def health(request: Request) -> Response:
        if service.healthy():
            return Response(status_code=200)
        return error_response(ApiError(503, "no healthy worker", kind="service_unavailable"))

    async def metrics(request: Request) -> Response:
        return Response(service.reports.metrics.exposition(), 200, media_type=PROMETHEUS)

    # --- SLO operations ---

    @guarded
    async def slo_status(request: Request) -> Response:
        return json_response(service.status())

    @guarded
    async def slo_migrate(request: Request) -> Response:
        body = await read_json(request)
        rid, target = body.get("rid"), body.get("to")
        if not isinstance(rid, str) or not rid:
            raise bad("rid", "must be a non-empty string")
        if not isinstance(target, str) or not target:
            raise bad("to", "must be a worker id")
        try:
            result = await service.migrate(rid, target)
        except KeyError:
            raise ApiError(404, f"no running request {rid!r}", "rid", kind="not_found") from None
        except MigrationRefused as exc:  # its output cannot be carried over (router/handover.py)
            raise ApiError(409, str(exc), "rid", kind="conflict") from None
        except ValueError as exc:
            raise bad("to", str(exc)) from None
        return json_response(result)

    routes = [
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/flush_cache", flush_cache, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/health_generate", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/slo/status", slo_status, methods=["GET"]),
        Route("/slo/migrate", slo_migrate, methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def run_service(app: Starlette) -> AsyncIterator[None]:
        await service.start()
        try:
            if on_started is not None:
                on_started(service)
            yield
        finally:
            await service.stop()

    unguarded = sorted({route.path for route in routes} - set(ROUTE_ROLES))
    if unguarded:
        raise RuntimeError(f"routes without a role in router.http_guard.ROUTE_ROLES: {unguarded}")
    table = service.config.access
    if table is None:  # a config from code (tests, embedders): its api_key is a client key
        table = AccessTable.build(api_key=service.config.api_key, env={})
    return RoleGuard(Starlette(routes=routes, lifespan=run_service if lifespan else None), table)
