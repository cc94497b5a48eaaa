"""SloMiddleware as ASGI in front of a small fake inner app: validation (400 naming the
field), injection into custom_params, `slo` blocks on OpenAI responses and SSE chunks,
/slo/status and /metrics, and pass-through of everything that is not ours."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

import server.slo_middleware as slo_middleware
from scheduler.core.shed_wire import Shed, shed_from
from scheduler.core.slo import SloClass, SloSpec
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server import request_context
from server.draining import Drain
from server.slo_middleware import SloMiddleware
from wire import ARRIVAL_PARAM, DRAINING, QUEUE_FULL, SLO_INFEASIBLE, SLO_PARAM
from wire import ORACLE_HINT_PARAM as ORACLE_HINT

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


def _make(inner=None, status=None):
    book = SloReportBook(SloMetrics())
    inner = inner or FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, status or (lambda: {"policy": "edf", "ok": True}))
    return mw, inner, book


def _finish_report(book, rid, slo=LAT, arrival=0.0, stamps=(0.05, 0.1)):
    book.start(rid, slo, arrival)
    book.on_output(
        {"id": rid, "slo_token_ts": list(stamps), "completion_tokens": len(stamps), "finish_reason": {"type": "stop"}}
    )
    report = book.report(rid)
    assert report is not None
    return report


def _json(obj) -> bytes:
    return orjson.dumps(obj)


def refused(path: str, body: bytes, status: int = 400) -> dict:
    """The error SloMiddleware answers a POST of `body` to `path` with, once it is checked that
    the status is `status` and the request never reached SGLang (the stand-in app saw no call)."""
    mw, inner, _ = _make()
    resp = Response(call(mw, "POST", path, body))
    assert resp.status == status, resp.body
    assert inner.calls == []
    return resp.json()["error"]


# --- validation -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path, body, headers, param",
    [
        ("/generate", {"text": "x", "slo": {"ttft_ms": -5}}, [], "slo.ttft_ms"),
        ("/generate", {"text": "x", "slo": {"warp": 9}}, [], "slo.warp"),
        (
            "/generate",
            {"text": "x", "sampling_params": {"custom_params": {"slo": {"class": "deadline"}}}},
            [],
            "sampling_params.custom_params.slo.deadline_ms",
        ),
        ("/v1/chat/completions", {"model": "m", "messages": [], "slo": "fast"}, [], "slo"),
        ("/v1/completions", {"model": "m", "prompt": "x"}, [(b"x-slo-tpot-ms", b"soon")], "x-slo-tpot-ms"),
        ("/v1/completions", {"model": "m", "prompt": "x"}, [(b"X-SLO-TTFT-MS", b"0")], "x-slo-ttft-ms"),
        ("/generate", {"text": "x", "sampling_params": "bad"}, [], "sampling_params"),
        ("/v1/completions", {"prompt": "x", "custom_params": [1]}, [], "custom_params"),
    ],
)
def test_bad_slo_is_400_naming_the_field_and_skips_inner_app(path, body, headers, param):
    mw, inner, _ = _make()
    resp = Response(call(mw, "POST", path, _json(body), headers))
    assert resp.status == 400
    assert resp.headers[b"content-type"] == b"application/json"
    assert int(resp.headers[b"content-length"]) == len(resp.body)
    err = resp.json()["error"]
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert err["code"] == 400
    assert err["message"].startswith(f"{param}: ")
    assert inner.calls == []


def test_oversized_body_is_413(monkeypatch):
    monkeypatch.setattr(slo_middleware, "MAX_BODY_BYTES", 10)
    mw, inner, _ = _make()
    resp = Response(call(mw, "POST", "/generate", b"67890", body_chunks=[b"12345", b"x"]))
    assert resp.status == 413
    assert resp.json()["error"]["param"] == "body"
    assert inner.calls == []


# --- injection ------------------------------------------------------------------------------------


def test_valid_native_request_injected_with_correct_length():
    mw, inner, _ = _make()
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "slo": {"ttft_ms": 100, "tpot_ms": 10}}
    before = time.time()
    resp = Response(
        call(mw, "POST", "/generate", _json(body), [(b"content-length", b"3"), (b"content-type", b"application/json")])
    )
    after = time.time()
    assert resp.status == 200
    assert len(inner.calls) == 1
    seen = inner.calls[0]
    got = orjson.loads(seen["body"])
    assert "slo" not in got
    custom = got["sampling_params"]["custom_params"]
    assert custom[SLO_PARAM] == LAT.to_dict()
    assert before <= custom[ARRIVAL_PARAM] <= after
    assert got["sampling_params"]["max_new_tokens"] == 4 and got["text"] == "hello"
    lengths = [v for k, v in seen["scope"]["headers"] if k.lower() == b"content-length"]
    assert lengths == [str(len(seen["body"])).encode()]  # the stale length replaced, not duplicated
    assert (b"content-type", b"application/json") in seen["scope"]["headers"]


def test_native_list_sampling_params_each_injected():
    mw, inner, _ = _make()
    body = {"text": ["a", "b"], "sampling_params": [{}, {"temperature": 0}]}
    call(mw, "POST", "/generate", _json(body), [(b"x-slo-deadline-ms", b"2500")])
    got = orjson.loads(inner.calls[0]["body"])
    for params in got["sampling_params"]:
        assert params["custom_params"][SLO_PARAM] == {"class": "deadline", "weight": 1.0, "deadline_ms": 2500.0}


def test_default_slo_injected_when_none_given():
    mw, inner, _ = _make()
    call(mw, "POST", "/v1/chat/completions", _json({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    got = orjson.loads(inner.calls[0]["body"])
    assert got["custom_params"][SLO_PARAM] == DEFAULT.to_dict()
    assert isinstance(got["custom_params"][ARRIVAL_PARAM], float)
    assert got["messages"] == [{"role": "user", "content": "x"}]


def test_chunked_request_body_reassembled():
    mw, inner, _ = _make()
    raw = _json({"model": "m", "prompt": "abc", "slo": {"deadline_ms": 500}})
    call(mw, "POST", "/v1/completions", raw[10:], body_chunks=[raw[:4], raw[4:10]])
    got = orjson.loads(inner.calls[0]["body"])
    assert got["custom_params"][SLO_PARAM]["deadline_ms"] == 500.0
    assert got["prompt"] == "abc"


@pytest.mark.parametrize("raw", [b"not json at all", b"[1, 2, 3]", b'"str"', b"", b'{"slo": {"ttft_ms": -1'])
def test_non_json_or_non_object_body_passes_through_untouched(raw):
    mw, inner, _ = _make()
    headers = [(b"content-length", str(len(raw)).encode())]
    resp = Response(call(mw, "POST", "/generate", raw, headers))
    assert resp.status == 200
    assert inner.calls[0]["body"] == raw
    assert inner.calls[0]["scope"]["headers"] == headers


# --- pass-through ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/health"), ("POST", "/v1/embeddings"), ("GET", "/generate"), ("POST", "/generate/extra")],
)
def test_other_routes_pass_through(method, path):
    mw, inner, _ = _make()
    raw = _json({"slo": {"ttft_ms": -1}})  # would be a 400 on a generate route
    resp = Response(call(mw, method, path, raw))
    assert resp.status == 200
    assert inner.calls[0]["body"] == raw
    assert inner.calls[0]["scope"]["path"] == path


def test_non_http_scope_passes_through():
    mw, inner, _ = _make()
    sent = call(mw, "GET", "/", scope_type="lifespan")
    assert sent == []
    assert inner.calls[0]["scope"]["type"] == "lifespan"


def test_native_response_not_rewritten():
    # native responses carry the report in meta_info already; the middleware leaves them alone
    book_rid = "native-1"
    body = _json({"id": book_rid, "text": "ok"})
    mw, inner, book = _make(FakeApp(chunks=(body,)))
    _finish_report(book, book_rid)
    resp = Response(call(mw, "POST", "/generate", _json({"text": "x"})))
    assert resp.body == body
    assert "slo" not in resp.json()


# --- OpenAI responses -----------------------------------------------------------------------------


def test_openai_json_response_gets_slo_block():
    payload = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hi", "finish_reason": "stop"}]}
    mw, _, book = _make(FakeApp(chunks=(_json(payload),), extra_headers=[(b"x-extra", b"1")]))
    report = _finish_report(book, "cmpl-1")
    resp = Response(call(mw, "POST", "/v1/completions", _json({"model": "m", "prompt": "p"})))
    got = resp.json()
    assert got["slo"] == report
    assert got["choices"] == payload["choices"]
    lengths = [v for k, v in resp.header_list if k == b"content-length"]
    assert lengths == [str(len(resp.body)).encode()]
    assert resp.headers[b"x-extra"] == b"1"


def test_openai_json_split_across_body_messages():
    raw = _json({"id": "chat-2", "choices": [{"message": {"content": "x"}, "finish_reason": "length"}]})
    mw, _, book = _make(FakeApp(chunks=(raw[:7], raw[7:20], raw[20:])))
    report = _finish_report(book, "chat-2")
    resp = Response(call(mw, "POST", "/v1/chat/completions", _json({"model": "m", "messages": []})))
    assert resp.json()["slo"] == report
    assert int(resp.headers[b"content-length"]) == len(resp.body)


@pytest.mark.parametrize(
    "raw",
    [
        _json({"id": "unknown", "choices": []}),  # no report for this id
        _json({"object": "error", "message": "bad"}),  # no id
        _json([1, 2]),
        b"{broken json",
    ],
)
def test_openai_json_without_report_unchanged(raw):
    mw, _, book = _make(FakeApp(chunks=(raw,)))
    _finish_report(book, "some-other-id")
    resp = Response(call(mw, "POST", "/v1/completions", _json({"model": "m", "prompt": "p"})))
    assert resp.body == raw
    assert int(resp.headers[b"content-length"]) == len(raw)


def test_openai_non_json_response_untouched():
    raw = b'{"id": "cmpl-9"} but as text'
    mw, _, book = _make(FakeApp(content_type=b"text/plain", chunks=(raw,)))
    _finish_report(book, "cmpl-9")
    resp = Response(call(mw, "POST", "/v1/completions", _json({"model": "m", "prompt": "p"})))
    assert resp.body == raw


def _sse(obj) -> bytes:
    return b"data: " + _json(obj) + b"\n\n"


def test_sse_final_chunk_gets_slo_others_untouched():
    rid = "chatcmpl-s"
    first = _sse({"id": rid, "choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    middle = _sse({"id": rid, "choices": [{"delta": {"content": "b"}}]})
    final = _sse({"id": rid, "choices": [{"delta": {}, "finish_reason": "stop"}]})
    usage = _sse({"id": rid, "choices": [], "usage": {"completion_tokens": 2}})
    done = b"data: [DONE]\n\n"
    chunks = (first, middle, final, usage, done)
    mw, _, book = _make(FakeApp(content_type=b"text/event-stream", chunks=chunks))
    report = _finish_report(book, rid)
    resp = Response(call(mw, "POST", "/v1/chat/completions", _json({"model": "m", "messages": [], "stream": True})))
    assert b"content-length" not in resp.headers
    assert len(resp.bodies) == len(chunks)
    out = dict(zip(["first", "middle", "final", "usage", "done"], resp.bodies))
    assert out["first"] == first
    assert out["middle"] == middle
    assert out["usage"] == usage
    assert out["done"] == done
    assert out["final"].startswith(b"data: ") and out["final"].endswith(b"\n\n")
    annotated = orjson.loads(out["final"][len(b"data: ") : -2])
    assert annotated["slo"] == report
    assert annotated["choices"][0]["finish_reason"] == "stop"


def test_sse_several_events_in_one_chunk():
    rid = "cmpl-multi"
    a = _sse({"id": rid, "choices": [{"text": "x", "finish_reason": None}]})
    b = _sse({"id": rid, "choices": [{"text": "", "finish_reason": "stop"}]})
    chunk = a + b + b"data: [DONE]\n\n"
    mw, _, book = _make(FakeApp(content_type=b"text/event-stream; charset=utf-8", chunks=(chunk,)))
    report = _finish_report(book, rid)
    resp = Response(call(mw, "POST", "/v1/completions", _json({"model": "m", "prompt": "p", "stream": True})))
    events = resp.body.split(b"\n\n")
    assert events[0] + b"\n\n" == a  # the unfinished event is byte-identical
    assert "slo" in orjson.loads(events[1][len(b"data: ") :])
    assert orjson.loads(events[1][len(b"data: ") :])["slo"] == report
    assert events[2] == b"data: [DONE]"
    assert resp.body.endswith(b"\n\n")


def test_sse_finish_without_report_untouched():
    chunk = _sse({"id": "nobody", "choices": [{"delta": {}, "finish_reason": "stop"}]})
    mw, _, book = _make(FakeApp(content_type=b"text/event-stream", chunks=(chunk,)))
    resp = Response(call(mw, "POST", "/v1/chat/completions", _json({"model": "m", "messages": []})))
    assert resp.body == chunk


# --- /slo/status and /metrics ---------------------------------------------------------------------


def test_slo_status_served_without_inner_app():
    status = {"policy": "edf", "attainment": {"latency": {"attained": 3}}, "n": 1}
    mw, inner, _ = _make(status=lambda: status)
    resp = Response(call(mw, "GET", "/slo/status"))
    assert resp.status == 200
    assert resp.json() == status
    assert resp.headers[b"content-type"] == b"application/json"
    assert int(resp.headers[b"content-length"]) == len(resp.body)
    assert inner.calls == []


def test_slo_status_calls_status_each_time():
    counter = {"n": 0}

    def status():
        counter["n"] += 1
        return {"n": counter["n"]}

    mw, _, _ = _make(status=status)
    assert Response(call(mw, "GET", "/slo/status")).json() == {"n": 1}
    assert Response(call(mw, "GET", "/slo/status")).json() == {"n": 2}


def test_metrics_appended_to_inner_body():
    inner_text = b"# HELP sglang_tokens x\nsglang_tokens 7\n\n"
    mw, inner, book = _make(FakeApp(content_type=b"text/plain", chunks=(inner_text[:10], inner_text[10:])))
    _finish_report(book, "m1")
    resp = Response(call(mw, "GET", "/metrics"))
    assert resp.status == 200
    assert resp.headers[b"content-type"].startswith(b"text/plain")
    assert int(resp.headers[b"content-length"]) == len(resp.body)
    assert resp.body.startswith(b"# HELP sglang_tokens x\nsglang_tokens 7\n")
    assert b"\n\n" not in resp.body[: len(inner_text)]  # trailing blank lines trimmed before ours
    assert b"sglang_slo_requests_total" in resp.body
    assert resp.body.endswith(book.metrics.exposition())
    assert len(inner.calls) == 1


def test_metrics_alone_when_inner_404():
    mw, _, book = _make(FakeApp(status=404, content_type=b"application/json", chunks=(b'{"detail":"Not Found"}',)))
    resp = Response(call(mw, "GET", "/metrics"))
    assert resp.status == 200
    assert resp.body == book.metrics.exposition()
    assert b"Not Found" not in resp.body


def test_metrics_asks_inner_app_for_uncompressed_text():
    mw, inner, _ = _make(FakeApp(content_type=b"text/plain", chunks=(b"sglang_tokens 7\n",)))
    call(mw, "GET", "/metrics", headers=[(b"accept-encoding", b"gzip"), (b"x-other", b"1")])
    forwarded = dict(inner.calls[0]["scope"]["headers"])
    assert b"accept-encoding" not in forwarded and forwarded[b"x-other"] == b"1"


@pytest.mark.parametrize(
    "token, forwarded, expect",
    [
        ("secret", "NOW-5", "forwarded"),  # the router agent's arrival counts
        ("wrong", "NOW-5", "local"),  # a client cannot back-date its request
        (None, "NOW-5", "local"),
        ("secret", "NOW+60", "local"),  # never later than it reached this server
        ("secret", "NOW-99999", "clamped"),  # at most an hour back
        ("secret", "soon", "local"),
    ],
)
def test_forwarded_arrival_is_trusted_only_from_the_agent(token, forwarded, expect):
    book = SloReportBook(SloMetrics())
    inner = FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, lambda: {}, agent_token="secret")
    now = time.time()
    value = forwarded.replace("NOW", "").strip()
    raw = str(now + float(value)) if value not in ("soon",) else value
    headers = [(b"x-slo-arrival", raw.encode())]
    if token is not None:
        headers.append((b"x-slo-agent-token", token.encode()))
    call(mw, "POST", "/generate", _json({"text": "x", "slo": {"ttft_ms": 100}}), headers)
    arrival = orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"][ARRIVAL_PARAM]
    if expect == "forwarded":
        assert arrival == pytest.approx(now - 5, abs=1e-3)
    elif expect == "clamped":
        assert now - 3601 < arrival < now - 3599
    else:
        assert now - 1 < arrival <= time.time()


# --- every generating route, internal keys, sheds, draining ---------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT"])
def test_a_forged_arrival_cannot_jump_the_queue_on_any_native_method(method):
    mw, inner, _ = _make()
    forged = {"text": "x", "sampling_params": {"custom_params": {ARRIVAL_PARAM: 1.0, "slo_token_ts": [0], "mine": 1}}}
    before = time.time()
    resp = Response(call(mw, method, "/generate", _json(forged)))
    assert resp.status == 200
    custom = orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"]
    assert custom[ARRIVAL_PARAM] >= before  # stamped here, not taken from the client
    assert "slo_token_ts" not in custom and custom["mine"] == 1 and SLO_PARAM in custom


def test_the_oracle_hint_survives_stripping():
    mw, inner, _ = _make()
    call(mw, "POST", "/generate", _json({"text": "x", "sampling_params": {"custom_params": {ORACLE_HINT: 7}}}))
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"][ORACLE_HINT] == 7


def test_the_agent_keeps_its_internal_keys():
    book = SloReportBook(SloMetrics())
    inner = FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, lambda: {}, agent_token="secret")
    body = {"text": "x", "sampling_params": {"custom_params": {"slo_private": 1}}}
    call(mw, "POST", "/generate", _json(body), [(b"x-slo-agent-token", b"secret")])
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"]["slo_private"] == 1


def test_invocations_and_vertex_are_validated_and_injected():
    mw, inner, _ = _make()
    bad = Response(call(mw, "POST", "/invocations", _json({"messages": [], "slo": {"ttft_ms": -1}})))
    assert bad.status == 400 and bad.json()["error"]["param"] == "slo.ttft_ms"
    call(mw, "POST", "/invocations", _json({"messages": [], "custom_params": {ARRIVAL_PARAM: 1.0}}))
    assert orjson.loads(inner.calls[0]["body"])["custom_params"][ARRIVAL_PARAM] > 1.0
    vertex = {"instances": [{"text": "x"}], "parameters": {"slo": {"ttft_ms": 100}}}
    call(mw, "POST", "/vertex_generate", _json(vertex))
    params = orjson.loads(inner.calls[1]["body"])["parameters"]
    assert "slo" not in params and params["sampling_params"]["custom_params"][SLO_PARAM]["ttft_ms"] == 100
    bad = Response(call(mw, "POST", "/vertex_generate", _json({"instances": [], "parameters": {"slo": {"x": 1}}})))
    assert bad.status == 400 and bad.json()["error"]["param"] == "parameters.slo.x"


def test_a_vertex_parameter_generate_does_not_take_is_a_400_naming_it():
    inner = FakeApp()
    mw = SloMiddleware(inner, SloReportBook(SloMetrics()), DEFAULT, lambda: {}, vertex_fields=frozenset({"text"}))
    body = {"instances": [{}], "parameters": {"text": "", "junk": None}}
    bad = Response(call(mw, "POST", "/vertex_generate", _json(body)))
    assert bad.status == 400 and bad.json()["error"]["param"] == "parameters.junk" and not inner.calls
    call(mw, "POST", "/vertex_generate", _json({"instances": [{}], "parameters": {"text": "x"}}))
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
    mw, _, _ = _make(ShedApp(shed, status=500, chunks=(b'{"detail": "x"}',)))
    resp = Response(call(mw, "POST", path, _json({"text": "x", "messages": []})))
    assert resp.status == 429
    assert resp.headers[b"retry-after"] == b"3"
    error = resp.json()["error"]
    assert error["reason"] == QUEUE_FULL and error["predicted_wait_ms"] == 2500.0 and error["class"] == "latency"
    assert error["code"] == 429


def test_a_stream_shed_before_its_first_chunk_gets_the_sheds_status():
    shed = Shed(QUEUE_FULL, retry_after_s=2)
    chunk = b'data: {"meta_info": {"finish_reason": {"type": "abort", "reason": "queue_full"}}}\n\n'
    mw, _, _ = _make(ShedApp(shed, content_type=b"text/event-stream", chunks=(chunk, b"data: [DONE]\n\n")))
    resp = Response(call(mw, "POST", "/generate", _json({"text": "x", "stream": True})))
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
    mw, _, _ = _make(LateShedApp())
    resp = Response(call(mw, "POST", "/generate", _json({"text": "x", "stream": True})))
    assert resp.status == 200 and resp.body == b"data: {}\n\ndata: abort\n\n"


def test_draining_refuses_new_work_and_fails_health_but_serves_status():
    drain = Drain()
    book = SloReportBook(SloMetrics())
    inner = FakeApp()
    mw = SloMiddleware(inner, book, DEFAULT, lambda: {"engine": {"queue_drain_s": 2.2}}, drain=drain)
    assert Response(call(mw, "GET", "/health")).status == 200
    drain.start()
    resp = Response(call(mw, "POST", "/generate", _json({"text": "x"})))
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
