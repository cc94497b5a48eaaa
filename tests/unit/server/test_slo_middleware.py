"""SloMiddleware as ASGI in front of a small fake inner app: validation (400 naming the
field), injection into custom_params, `slo` blocks on OpenAI responses and SSE chunks,
/slo/status and /metrics, and pass-through of everything that is not ours."""

from __future__ import annotations

import time

import orjson
import pytest

import server.slo_middleware as slo_middleware
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server.slo_middleware import SloMiddleware
from tests.unit.server.middleware_harness import (
    DEFAULT,
    LAT,
    FakeApp,
    Response,
    call,
    finish_report,
    json_body,
    make_middleware,
)
from wire import ARRIVAL_PARAM, SLO_PARAM

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
    mw, inner, _ = make_middleware()
    resp = Response(call(mw, "POST", path, json_body(body), headers))
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
    mw, inner, _ = make_middleware()
    resp = Response(call(mw, "POST", "/generate", b"67890", body_chunks=[b"12345", b"x"]))
    assert resp.status == 413
    assert resp.json()["error"]["param"] == "body"
    assert inner.calls == []


# --- injection ------------------------------------------------------------------------------------


def test_valid_native_request_injected_with_correct_length():
    mw, inner, _ = make_middleware()
    body = {"text": "hello", "sampling_params": {"max_new_tokens": 4}, "slo": {"ttft_ms": 100, "tpot_ms": 10}}
    before = time.time()
    resp = Response(
        call(
            mw,
            "POST",
            "/generate",
            json_body(body),
            [(b"content-length", b"3"), (b"content-type", b"application/json")],
        )
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
    mw, inner, _ = make_middleware()
    body = {"text": ["a", "b"], "sampling_params": [{}, {"temperature": 0}]}
    call(mw, "POST", "/generate", json_body(body), [(b"x-slo-deadline-ms", b"2500")])
    got = orjson.loads(inner.calls[0]["body"])
    for params in got["sampling_params"]:
        assert params["custom_params"][SLO_PARAM] == {"class": "deadline", "weight": 1.0, "deadline_ms": 2500.0}


def test_default_slo_injected_when_none_given():
    mw, inner, _ = make_middleware()
    call(mw, "POST", "/v1/chat/completions", json_body({"model": "m", "messages": [{"role": "user", "content": "x"}]}))
    got = orjson.loads(inner.calls[0]["body"])
    assert got["custom_params"][SLO_PARAM] == DEFAULT.to_dict()
    assert isinstance(got["custom_params"][ARRIVAL_PARAM], float)
    assert got["messages"] == [{"role": "user", "content": "x"}]


def test_chunked_request_body_reassembled():
    mw, inner, _ = make_middleware()
    raw = json_body({"model": "m", "prompt": "abc", "slo": {"deadline_ms": 500}})
    call(mw, "POST", "/v1/completions", raw[10:], body_chunks=[raw[:4], raw[4:10]])
    got = orjson.loads(inner.calls[0]["body"])
    assert got["custom_params"][SLO_PARAM]["deadline_ms"] == 500.0
    assert got["prompt"] == "abc"


@pytest.mark.parametrize("raw", [b"not json at all", b"[1, 2, 3]", b'"str"', b"", b'{"slo": {"ttft_ms": -1'])
def test_non_json_or_non_object_body_passes_through_untouched(raw):
    mw, inner, _ = make_middleware()
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
    mw, inner, _ = make_middleware()
    raw = json_body({"slo": {"ttft_ms": -1}})  # would be a 400 on a generate route
    resp = Response(call(mw, method, path, raw))
    assert resp.status == 200
    assert inner.calls[0]["body"] == raw
    assert inner.calls[0]["scope"]["path"] == path


def test_non_http_scope_passes_through():
    mw, inner, _ = make_middleware()
    sent = call(mw, "GET", "/", scope_type="lifespan")
    assert sent == []
    assert inner.calls[0]["scope"]["type"] == "lifespan"


def test_native_response_not_rewritten():
    # native responses carry the report in meta_info already; the middleware leaves them alone
    book_rid = "native-1"
    body = json_body({"id": book_rid, "text": "ok"})
    mw, inner, book = make_middleware(FakeApp(chunks=(body,)))
    finish_report(book, book_rid)
    resp = Response(call(mw, "POST", "/generate", json_body({"text": "x"})))
    assert resp.body == body
    assert "slo" not in resp.json()


# --- OpenAI responses -----------------------------------------------------------------------------


def test_openai_json_response_gets_slo_block():
    payload = {"id": "cmpl-1", "object": "text_completion", "choices": [{"text": "hi", "finish_reason": "stop"}]}
    mw, _, book = make_middleware(FakeApp(chunks=(json_body(payload),), extra_headers=[(b"x-extra", b"1")]))
    report = finish_report(book, "cmpl-1")
    resp = Response(call(mw, "POST", "/v1/completions", json_body({"model": "m", "prompt": "p"})))
    got = resp.json()
    assert got["slo"] == report
    assert got["choices"] == payload["choices"]
    lengths = [v for k, v in resp.header_list if k == b"content-length"]
    assert lengths == [str(len(resp.body)).encode()]
    assert resp.headers[b"x-extra"] == b"1"


def test_openai_json_split_across_body_messages():
    raw = json_body({"id": "chat-2", "choices": [{"message": {"content": "x"}, "finish_reason": "length"}]})
    mw, _, book = make_middleware(FakeApp(chunks=(raw[:7], raw[7:20], raw[20:])))
    report = finish_report(book, "chat-2")
    resp = Response(call(mw, "POST", "/v1/chat/completions", json_body({"model": "m", "messages": []})))
    assert resp.json()["slo"] == report
    assert int(resp.headers[b"content-length"]) == len(resp.body)


@pytest.mark.parametrize(
    "raw",
    [
        json_body({"id": "unknown", "choices": []}),  # no report for this id
        json_body({"object": "error", "message": "bad"}),  # no id
        json_body([1, 2]),
        b"{broken json",
    ],
)
def test_openai_json_without_report_unchanged(raw):
    mw, _, book = make_middleware(FakeApp(chunks=(raw,)))
    finish_report(book, "some-other-id")
    resp = Response(call(mw, "POST", "/v1/completions", json_body({"model": "m", "prompt": "p"})))
    assert resp.body == raw
    assert int(resp.headers[b"content-length"]) == len(raw)


def test_openai_non_json_response_untouched():
    raw = b'{"id": "cmpl-9"} but as text'
    mw, _, book = make_middleware(FakeApp(content_type=b"text/plain", chunks=(raw,)))
    finish_report(book, "cmpl-9")
    resp = Response(call(mw, "POST", "/v1/completions", json_body({"model": "m", "prompt": "p"})))
    assert resp.body == raw


def _sse(obj) -> bytes:
    return b"data: " + json_body(obj) + b"\n\n"


def test_sse_final_chunk_gets_slo_others_untouched():
    rid = "chatcmpl-s"
    first = _sse({"id": rid, "choices": [{"delta": {"content": "a"}, "finish_reason": None}]})
    middle = _sse({"id": rid, "choices": [{"delta": {"content": "b"}}]})
    final = _sse({"id": rid, "choices": [{"delta": {}, "finish_reason": "stop"}]})
    usage = _sse({"id": rid, "choices": [], "usage": {"completion_tokens": 2}})
    done = b"data: [DONE]\n\n"
    chunks = (first, middle, final, usage, done)
    mw, _, book = make_middleware(FakeApp(content_type=b"text/event-stream", chunks=chunks))
    report = finish_report(book, rid)
    resp = Response(call(mw, "POST", "/v1/chat/completions", json_body({"model": "m", "messages": [], "stream": True})))
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
    mw, _, book = make_middleware(FakeApp(content_type=b"text/event-stream; charset=utf-8", chunks=(chunk,)))
    report = finish_report(book, rid)
    resp = Response(call(mw, "POST", "/v1/completions", json_body({"model": "m", "prompt": "p", "stream": True})))
    events = resp.body.split(b"\n\n")
    assert events[0] + b"\n\n" == a  # the unfinished event is byte-identical
    assert "slo" in orjson.loads(events[1][len(b"data: ") :])
    assert orjson.loads(events[1][len(b"data: ") :])["slo"] == report
    assert events[2] == b"data: [DONE]"
    assert resp.body.endswith(b"\n\n")


def test_sse_finish_without_report_untouched():
    chunk = _sse({"id": "nobody", "choices": [{"delta": {}, "finish_reason": "stop"}]})
    mw, _, book = make_middleware(FakeApp(content_type=b"text/event-stream", chunks=(chunk,)))
    resp = Response(call(mw, "POST", "/v1/chat/completions", json_body({"model": "m", "messages": []})))
    assert resp.body == chunk


# --- /slo/status and /metrics ---------------------------------------------------------------------


def test_slo_status_served_without_inner_app():
    status = {"policy": "edf", "attainment": {"latency": {"attained": 3}}, "n": 1}
    mw, inner, _ = make_middleware(status=lambda: status)
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

    mw, _, _ = make_middleware(status=status)
    assert Response(call(mw, "GET", "/slo/status")).json() == {"n": 1}
    assert Response(call(mw, "GET", "/slo/status")).json() == {"n": 2}


def test_metrics_appended_to_inner_body():
    inner_text = b"# HELP sglang_tokens x\nsglang_tokens 7\n\n"
    mw, inner, book = make_middleware(FakeApp(content_type=b"text/plain", chunks=(inner_text[:10], inner_text[10:])))
    finish_report(book, "m1")
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
    mw, _, book = make_middleware(
        FakeApp(status=404, content_type=b"application/json", chunks=(b'{"detail":"Not Found"}',))
    )
    resp = Response(call(mw, "GET", "/metrics"))
    assert resp.status == 200
    assert resp.body == book.metrics.exposition()
    assert b"Not Found" not in resp.body


def test_metrics_asks_inner_app_for_uncompressed_text():
    mw, inner, _ = make_middleware(FakeApp(content_type=b"text/plain", chunks=(b"sglang_tokens 7\n",)))
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
    call(mw, "POST", "/generate", json_body({"text": "x", "slo": {"ttft_ms": 100}}), headers)
    arrival = orjson.loads(inner.calls[0]["body"])["sampling_params"]["custom_params"][ARRIVAL_PARAM]
    if expect == "forwarded":
        assert arrival == pytest.approx(now - 5, abs=1e-3)
    elif expect == "clamped":
        assert now - 3601 < arrival < now - 3599
    else:
        assert now - 1 < arrival <= time.time()
