"""The harness of the SloMiddleware unit tests: a small fake inner app standing in for SGLang,
an ASGI caller, and the middleware built with a report book and a default SLO."""

from __future__ import annotations

import asyncio

import orjson

from scheduler.core.slo import SloClass, SloSpec
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server.slo_middleware import SloMiddleware

LAT = SloSpec(ttft_ms=100.0, tpot_ms=10.0, slo_class=SloClass.LATENCY)
DEFAULT = SloSpec(deadline_ms=60_000.0, slo_class=SloClass.DEADLINE)


class FakeApp:
    """Records what reached it and answers with a canned response."""

    def __init__(self, status=200, content_type=b"application/json", chunks=(b"{}",), extra_headers=()):
        self.calls: list[dict] = []
        self.status = status
        self.content_type = content_type
        self.chunks = list(chunks)
        self.extra_headers = list(extra_headers)

    async def __call__(self, scope, receive, send):
        body = b""
        if scope["type"] == "http":
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if not msg.get("more_body", False):
                    break
        self.calls.append({"scope": scope, "body": body})
        if scope["type"] != "http":
            return
        headers = [(b"content-type", self.content_type), *self.extra_headers]
        if self.content_type != b"text/event-stream":
            headers.append((b"content-length", str(sum(len(c) for c in self.chunks)).encode()))
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        for i, chunk in enumerate(self.chunks):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(self.chunks) - 1})


class Response:
    def __init__(self, messages):
        self.messages = messages
        start = messages[0]
        assert start["type"] == "http.response.start"
        self.status = start["status"]
        self.headers = {k: v for k, v in start["headers"]}
        self.header_list = start["headers"]
        self.bodies = [m.get("body", b"") for m in messages[1:] if m["type"] == "http.response.body"]
        self.body = b"".join(self.bodies)

    def json(self):
        return orjson.loads(self.body)


def json_body(obj) -> bytes:
    """A request body as the client sends it."""
    return orjson.dumps(obj)


def call(app, method, path, body=b"", headers=(), body_chunks=None, scope_type="http"):
    pending = [{"type": "http.request", "body": c, "more_body": True} for c in (body_chunks or [])]
    pending.append({"type": "http.request", "body": body, "more_body": False})
    sent: list[dict] = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": scope_type, "method": method, "path": path, "headers": list(headers)}
    asyncio.run(app(scope, receive, send))
    return sent


def make_middleware(inner=None, status=None):
    book = SloReportBook(SloMetrics())
    inner = inner or FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, status or (lambda: {"policy": "edf", "ok": True}))
    return mw, inner, book


def finish_report(book, rid, slo=LAT, arrival=0.0, stamps=(0.05, 0.1)):
    book.start(rid, slo, arrival)
    book.on_output(
        {"id": rid, "slo_token_ts": list(stamps), "completion_tokens": len(stamps), "finish_reason": {"type": "stop"}}
    )
    report = book.report(rid)
    assert report is not None
    return report


def refused(path: str, body: bytes, status: int = 400) -> dict:
    """The error SloMiddleware answers a POST of `body` to `path` with, once it is checked that
    the status is `status` and the request never reached SGLang (the stand-in app saw no call)."""
    mw, inner, _ = make_middleware()
    resp = Response(call(mw, "POST", path, body))
    assert resp.status == status, resp.body
    assert inner.calls == []
    return resp.json()["error"]
