"""Plain ASGI plumbing for the worker's HTTP edge: read a bounded body, hand it on again, answer
with a body, and capture an inner app's whole answer so it can be rewritten."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from scheduler.core.shed_wire import Shed
from scheduler.core.slo import SloValidationError

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


def error_body(field: str, message: str, status: int = 400) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": f"{field}: {message}",
                "type": "invalid_request_error",
                "param": field,
                "code": status,
            }
        }
    )


async def respond(send: Send, status: int, body: bytes, content_type: bytes = b"application/json") -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; a SloValidationError naming `body` past `limit` bytes."""
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise SloValidationError("body", f"larger than {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def replay_body(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def with_length(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    kept = [(k, v) for k, v in headers if k.lower() != b"content-length"]
    return kept + [(b"content-length", str(length).encode())]


App = Callable[[Scope, Receive, Send], Awaitable[None]]


async def capture_response(app: App, scope: Scope, receive: Receive) -> tuple[int, list[Any], bytes]:
    """The inner app's whole answer (status, headers, body), uncompressed so it can be rewritten."""
    captured: dict[str, Any] = {"status": 404, "headers": [], "body": []}

    async def capture(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            captured["status"] = message["status"]
            captured["headers"] = message.get("headers", [])
        elif message["type"] == "http.response.body":
            captured["body"].append(message.get("body", b""))

    plain = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"accept-encoding"]
    await app({**scope, "headers": plain}, receive, capture)
    return captured["status"], captured["headers"], b"".join(captured["body"])


async def respond_shed(send: Send, shed: Shed) -> None:
    body = orjson.dumps(shed.body())
    await send(
        {
            "type": "http.response.start",
            "status": shed.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *((k.encode(), v.encode()) for k, v in shed.headers().items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
