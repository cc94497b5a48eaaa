"""The router's HTTP plumbing shared by its routes: JSON and event-stream answers, the body
read with its bounds, the client's disconnect raced against the work, and `guarded`, which turns
every failure into a JSON error (the router never answers with a traceback)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from router.access import PRINCIPAL_SCOPE_KEY, Principal
from router.api_error import ApiError, bad
from router.flight import NO_WORKER, WORKER_FAILED, NoWorkerAvailable, RouterQueueFull, StreamError
from router.flight_table import NO_WORKER_RETRY_S
from router.protocol import MAX_MESSAGE_BYTES
from router.tokenizer import TokenizerUnavailable
from router.worker_proxy import WorkerUnavailable
from scheduler.core.json_depth import unforwardable

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = MAX_MESSAGE_BYTES  # nothing larger could reach a worker
T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before its response was ready."""


# --- small helpers ---


def json_response(content: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS), status, media_type="application/json")


def error_response(err: ApiError) -> Response:
    response = json_response(err.body(), err.status)
    response.headers.update(err.headers())
    return response


def sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


def worker_error(err: StreamError) -> ApiError:
    """A StreamError as the client sees it: the worker's status, its message unwrapped from JSON."""
    message = err.message
    with contextlib.suppress(orjson.JSONDecodeError, TypeError):
        parsed = orjson.loads(message)
        inner = parsed.get("error", parsed) if isinstance(parsed, dict) else None
        if isinstance(inner, dict) and isinstance(inner.get("message"), str):
            message = inner["message"]
        elif isinstance(parsed, dict) and isinstance(parsed.get("detail"), str):
            message = parsed["detail"]
    where = f" (worker {err.worker_id})" if err.worker_id else ""
    if err.shed is not None:
        return ApiError.from_shed(err.shed, where)
    reason = err.reason or (WORKER_FAILED if err.status >= 500 else None)  # a worker's own 5xx: retry elsewhere
    retry = err.retry_after_s if err.retry_after_s is not None else (1 if reason else None)
    return ApiError(err.status, message + where, reason=reason, retry_after_s=retry)


async def read_json(request: Request) -> dict[str, Any]:
    """The body as a JSON object; 413 past the size limit, 400 when not a JSON object."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ApiError(413, f"larger than {MAX_BODY_BYTES} bytes", "body")
        chunks.append(chunk)
    try:
        body = orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise bad("body", f"not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad("body", "must be a JSON object")
    why = unforwardable(body)  # parsed, but the worker link could not carry it
    if why is not None:
        raise bad("body", why)
    return body


def lower_headers(request: Request) -> dict[str, str]:
    return {k.lower(): v for k, v in request.headers.items()}


def caller(request: Request) -> Principal | None:
    """The authenticated caller the guard left in the scope (router.access.Principal), if any:
    its key's SLO limits, program namespace and fair share apply to what it sends."""
    return request.scope.get(PRINCIPAL_SCOPE_KEY)


async def _until_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(awaitable: Awaitable[T], receive: Receive) -> T:
    """Await `awaitable` unless the client disconnects first (then it is cancelled: ClientGone)."""
    task = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(_until_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
        await asyncio.gather(watch, task, return_exceptions=True)
    if task.cancelled():
        raise ClientGone
    return task.result()


def guarded(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """Every failure becomes a JSON error response; the router never answers with a traceback."""

    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except ApiError as exc:
            return error_response(exc)
        except RouterQueueFull as exc:
            return error_response(ApiError.from_shed(exc.shed))
        except (NoWorkerAvailable, TokenizerUnavailable) as exc:
            err = ApiError(503, str(exc), kind="service_unavailable", reason=NO_WORKER, retry_after_s=NO_WORKER_RETRY_S)
            return error_response(err)
        except WorkerUnavailable as exc:
            reason = NO_WORKER if exc.status == 503 else WORKER_FAILED
            retry = NO_WORKER_RETRY_S if exc.status == 503 else 1
            err = ApiError(exc.status, str(exc), kind="service_unavailable", reason=reason, retry_after_s=retry)
            return error_response(err)
        except ClientGone:
            return Response(status_code=499)
        except Exception:  # noqa: BLE001 - one bad request must not take the router down
            logger.exception("error serving %s %s", request.method, request.url.path)
            return error_response(ApiError(500, "internal router error (see the router log)"))

    return wrapped


class SseResponse(StreamingResponse):
    """An event stream that also watches for the client leaving, on every ASGI spec version,
    and always runs `on_close` (abort the request, score it) however the stream ends."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]]) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._content = content
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.ensure_future(self.stream_response(send))
        watch = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            await self._on_close()
        if pump.done() and not pump.cancelled() and pump.exception() is not None:
            exc = pump.exception()
            if not isinstance(exc, OSError):  # a send to a gone client is a disconnect, not a bug
                logger.error("event stream failed", exc_info=exc)
