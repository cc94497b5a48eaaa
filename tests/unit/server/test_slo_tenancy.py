"""Per-key SLO limits at a worker's own HTTP edge (SloMiddleware in front of a fake inner app),
for callers that reach a worker directly: the SLO that reaches SGLang is clamped (or the request
refused with 403 naming the field), the program id is the key's, the tenant is the key's and not
what the client wrote, and the SLO report says what was clamped. The router's agent is trusted:
what it forwards was held to the key's terms at the router."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from router.access import OPEN_ACCESS, PRINCIPAL_SCOPE_KEY, Principal, Role
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.slo_limits import REJECT, SloLimits
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server import request_context
from server.slo_middleware import SloMiddleware
from wire import AGENT_TOKEN_HEADER, SHARE_PARAM, SLO_PARAM, TENANT_PARAM

LIMITED = Principal("tenant-a", Role.CLIENT, SloLimits(min_ttft_ms=1000.0, max_weight=2.0), share=3.0)
STRICT = Principal("tenant-s", Role.CLIENT, SloLimits(min_ttft_ms=1000.0, on_violation=REJECT))
AGENT_TOKEN = "agent-token-0123456789"


class Inner:
    """Records the body that reached SGLang and the request context's clamp note."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.clamped: list[Any] = []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        raw = b""
        while True:
            msg = await receive()
            raw += msg.get("body", b"")
            if not msg.get("more_body", False):
                break
        self.bodies.append(orjson.loads(raw))
        ctx = request_context.current()
        self.clamped.append(ctx.slo_clamped if ctx is not None else None)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


def _post(path: str, body: dict, principal: Principal | None, headers: tuple = ()) -> tuple[int, dict, Inner]:
    inner = Inner()
    mw = SloMiddleware(inner, SloReportBook(SloMetrics()), None, lambda: {}, agent_token=AGENT_TOKEN)
    pending = [{"type": "http.request", "body": orjson.dumps(body), "more_body": False}]
    sent: list[dict] = []

    async def receive() -> dict:
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "http", "method": "POST", "path": path, "headers": list(headers)}
    if principal is not None:
        scope[PRINCIPAL_SCOPE_KEY] = principal
    asyncio.run(mw(scope, receive, send))
    body_out = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], orjson.loads(body_out), inner


def _custom(inner: Inner, native: bool = True) -> dict:
    body = inner.bodies[-1]
    return (body["sampling_params"] if native else body)["custom_params"]


def test_a_direct_caller_is_clamped_namespaced_and_its_tenant_is_its_key() -> None:
    forged = {TENANT_PARAM: "tenant-b", SHARE_PARAM: 99.0}
    body = {
        "text": "x",
        "slo": {"ttft_ms": 0.001, "weight": 5, "program_id": "p", "deadline_ms": 60_000, "class": "latency"},
        "sampling_params": {"custom_params": forged},
    }
    status, _, inner = _post("/generate", body, LIMITED)
    assert status == 200
    custom = _custom(inner)
    assert custom[SLO_PARAM]["ttft_ms"] == 1000.0 and custom[SLO_PARAM]["weight"] == 2.0
    assert custom[SLO_PARAM]["program_id"] == "tenant-a/p"
    assert custom[TENANT_PARAM] == "tenant-a" and custom[SHARE_PARAM] == 3.0
    assert inner.clamped == [{"ttft_ms": {"asked": 0.001, "granted": 1000.0}, "weight": {"asked": 5.0, "granted": 2.0}}]
    status, _, inner = _post("/v1/completions", {"model": "m", "prompt": "x", "slo": {"ttft_ms": 3}}, LIMITED)
    assert status == 200 and _custom(inner, native=False)[SLO_PARAM]["ttft_ms"] == 1000.0


def test_a_reject_key_gets_403_naming_the_field() -> None:
    for path, body in (
        ("/generate", {"text": "x", "slo": {"ttft_ms": 1}}),
        ("/v1/chat/completions", {"model": "m", "messages": [], "slo": {"ttft_ms": 1}}),
    ):
        status, err, inner = _post(path, body, STRICT)
        assert status == 403 and err["error"]["param"] == "slo.ttft_ms", err
        assert inner.bodies == []


def test_no_key_and_the_routers_agent_are_left_as_they_are() -> None:
    body = {"text": "x", "slo": {"ttft_ms": 0.001}}
    for principal in (None, OPEN_ACCESS):
        status, _, inner = _post("/generate", body, principal)
        assert status == 200 and _custom(inner)[SLO_PARAM]["ttft_ms"] == 0.001 and TENANT_PARAM not in _custom(inner)
    # the agent forwards what the router already held to the key's terms, tenant included
    held = {"text": "x", "slo": {"ttft_ms": 1000}, "sampling_params": {"custom_params": {TENANT_PARAM: "tenant-b"}}}
    agent = ((AGENT_TOKEN_HEADER.encode(), AGENT_TOKEN.encode()),)
    status, _, inner = _post("/generate", held, LIMITED, agent)
    assert status == 200 and _custom(inner)[TENANT_PARAM] == "tenant-b" and inner.clamped == [None]


def test_the_workers_report_says_what_was_clamped() -> None:
    book = SloReportBook(SloMetrics())
    clamped = {"ttft_ms": {"asked": 0.001, "granted": 1000.0}}
    book.start("r", SloSpec(ttft_ms=1000.0, slo_class=SloClass.LATENCY), 0.0, clamped=clamped)
    meta: dict[str, Any] = {"id": "r", "slo_token_ts": [0.1], "completion_tokens": 1, "finish_reason": {"type": "stop"}}
    book.on_output(meta)
    assert meta["slo"]["clamped"] == clamped and book.report("r")["clamped"] == clamped
