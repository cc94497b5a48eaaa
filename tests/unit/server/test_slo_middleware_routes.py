"""SloMiddleware on every generating route (a forged arrival, internal keys kept from clients,
Vertex and SageMaker), sheds answered with their status, Retry-After and reason (streamed or
not), draining, and the start-up hook."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from scheduler.core.shed_wire import Shed, shed_from
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server import request_context
from server.draining import Drain
from server.slo_middleware import SloMiddleware
from tests.unit.server.middleware_harness import (
    DEFAULT,
    FakeApp,
    Response,
    call,
    json_body,
    make_middleware,
)
from wire import ARRIVAL_PARAM, DRAINING, QUEUE_FULL, SLO_INFEASIBLE, SLO_PARAM
from wire import ORACLE_HINT_PARAM as ORACLE_HINT

# --- validation -----------------------------------------------------------------------------------


# --- every generating route, internal keys, sheds, draining ---------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_a_forged_arrival_cannot_jump_the_queue_on_any_native_method(method):
    mw, inner, _ = make_middleware()
    forged = {"text": "x", "sampling_params": {"custom_params": {ARRIVAL_PARAM: 1.0, "slo_token_ts": [0], "mine": 1}}}
    before = time.time()
    resp = Response(call(mw, method, "/generate", json_body(forged)))
    assert resp.status == 200
    custom = orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"]
    assert custom[ARRIVAL_PARAM] >= before  # stamped here, not taken from the client
    assert "slo_token_ts" not in custom and custom["mine"] == 1 and SLO_PARAM in custom


def test_the_oracle_hint_survives_stripping():
    mw, inner, _ = make_middleware()
    call(mw, "POST", "/generate", json_body({"text": "x", "sampling_params": {"custom_params": {ORACLE_HINT: 7}}}))
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"][ORACLE_HINT] == 7


def test_the_agent_keeps_its_internal_keys():
    book = SloReportBook(SloMetrics())
    inner = FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, lambda: {}, agent_token="secret")
    body = {"text": "x", "sampling_params": {"custom_params": {"slo_private": 1}}}
    call(mw, "POST", "/generate", json_body(body), [(b"x-slo-agent-token", b"secret")])
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"]["slo_private"] == 1


def test_invocations_and_vertex_are_validated_and_injected():
    mw, inner, _ = make_middleware()
    bad = Response(call(mw, "POST", "/invocations", json_body({"messages": [], "slo": {"ttft_ms": -1}})))
    assert bad.status == 400 and bad.json()["error"]["param"] == "slo.ttft_ms"
    call(mw, "POST", "/invocations", json_body({"messages": [], "custom_params": {ARRIVAL_PARAM: 1.0}}))
    assert orjson.loads(inner.calls[0]["body"])["custom_params"][ARRIVAL_PARAM] > 1.0
    vertex = {"instances": [{"text": "x"}], "parameters": {"slo": {"ttft_ms": 100}}}
    call(mw, "POST", "/vertex_generate", json_body(vertex))
    params = orjson.loads(inner.calls[1]["body"])["parameters"]
    assert "slo" not in params and params["sampling_params"]["custom_params"][SLO_PARAM]["ttft_ms"] == 100
    bad = Response(call(mw, "POST", "/vertex_generate", json_body({"instances": [], "parameters": {"slo": {"x": 1}}})))
    assert bad.status == 400 and bad.json()["error"]["param"] == "parameters.slo.x"


def test_a_vertex_parameter_generate_does_not_take_is_a_400_naming_it():
    inner = FakeApp()
    mw = SloMiddleware(inner, SloReportBook(SloMetrics()), DEFAULT, lambda: {}, vertex_fields=frozenset({"text"}))
    body = {"instances": [{}], "parameters": {"text": "", "junk": None}}
    bad = Response(call(mw, "POST", "/vertex_generate", json_body(body)))
    assert bad.status == 400 and bad.json()["error"]["param"] == "parameters.junk" and not inner.calls
    call(mw, "POST", "/vertex_generate", json_body({"instances": [{}], "parameters": {"text": "x"}}))
    assert len(inner.calls) == 1


@pytest.mark.parametrize("carrier", ["finish_reason", "error_body"])
def test_a_sheds_engine_code_survives_the_wire(carrier):
    shed = Shed("queue_timeout", retry_after_s=2, code="slo_queue_timeout")
    fields = shed.finish_reason() if carrier == "finish_reason" else shed.body()["error"]
    back = shed_from(fields)
    assert back is not None and back.code == "slo_queue_timeout" and back.message == shed.message
    assert shed_from(Shed("queue_full", retry_after_s=1).body()["error"]).code is None


class ShedApp(FakeApp):
    """An inner app whose tokenizer manager notes a shed, then answers as SGLang would."""

    def __init__(self, shed, **kw):
        super().__init__(**kw)
        self.shed = shed

    async def __call__(self, scope, receive, send):
        request_context.current().shed = self.shed
        await super().__call__(scope, receive, send)


@pytest.mark.parametrize("path", ["/generate", "/v1/chat/completions"])
def test_a_shed_request_gets_its_status_retry_after_and_reason(path):
    shed = Shed(QUEUE_FULL, retry_after_s=3, predicted_wait_ms=2500.0, slo_class="latency")
    mw, _, _ = make_middleware(ShedApp(shed, status=500, chunks=(b'{"detail": "x"}',)))
    resp = Response(call(mw, "POST", path, json_body({"text": "x", "messages": []})))
    assert resp.status == 429
    assert resp.headers[b"retry-after"] == b"3"
    error = resp.json()["error"]
    assert error["reason"] == QUEUE_FULL and error["predicted_wait_ms"] == 2500.0 and error["class"] == "latency"
    assert error["code"] == 429


def test_a_stream_shed_before_its_first_chunk_gets_the_sheds_status():
    shed = Shed(QUEUE_FULL, retry_after_s=2)
    chunk = b'data: {"meta_info": {"finish_reason": {"type": "abort", "reason": "queue_full"}}}\n\n'
    mw, _, _ = make_middleware(ShedApp(shed, content_type=b"text/event-stream", chunks=(chunk, b"data: [DONE]\n\n")))
    resp = Response(call(mw, "POST", "/generate", json_body({"text": "x", "stream": True})))
    assert resp.status == 429 and resp.json()["error"]["reason"] == QUEUE_FULL
    assert resp.headers[b"retry-after"] == b"2"


class LateShedApp(FakeApp):
    """A stream shed after its first chunk went out (a queue timeout after a retraction)."""

    async def __call__(self, scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        request_context.current().shed = Shed(SLO_INFEASIBLE, retry_after_s=1)
        await send({"type": "http.response.body", "body": b"data: abort\n\n", "more_body": False})


def test_a_stream_shed_after_it_started_keeps_its_abort_chunk():
    mw, _, _ = make_middleware(LateShedApp())
    resp = Response(call(mw, "POST", "/generate", json_body({"text": "x", "stream": True})))
    assert resp.status == 200 and resp.body == b"data: {}\n\ndata: abort\n\n"


def test_draining_refuses_new_work_and_fails_health_but_serves_status():
    drain = Drain()
    book = SloReportBook(SloMetrics())
    inner = FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, lambda: {"engine": {"queue_drain_s": 2.2}}, drain=drain)
    assert Response(call(mw, "GET", "/health")).status == 200
    drain.start()
    resp = Response(call(mw, "POST", "/generate", json_body({"text": "x"})))
    assert resp.status == 503 and resp.json()["error"]["reason"] == DRAINING
    assert resp.headers[b"retry-after"] == b"3"
    assert Response(call(mw, "GET", "/health")).status == 503
    assert Response(call(mw, "GET", "/slo/status")).status == 200
    assert len(inner.calls) == 1  # only the first health check reached SGLang


def test_on_started_runs_once_after_lifespan_startup():
    started = []

    class Lifespan:
        async def __call__(self, scope, receive, send):
            await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.startup.complete"})

    mw = SloMiddleware(Lifespan(), SloReportBook(SloMetrics()), None, dict, on_started=lambda: started.append(1))
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "lifespan.startup"}

    asyncio.run(mw({"type": "lifespan"}, receive, send))
    assert started == [1] and len(sent) == 2
