"""The router's HTTP API over a real dispatcher and ZMQ endpoint with scripted fake workers:
SGLang-native and OpenAI formats (streamed and not), field-naming 400s, 401/503, worker errors
passed through, client disconnects aborting, migration, status, metrics and the proxied
worker-info routes."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import orjson
import pytest
import zmq.asyncio

from router.requests import DEFAULT_MAX_NEW_TOKENS
from router.tokenizer import RouterTokenizer
from server.asgi_io import replay_body
from tests.unit.router._fake_worker import until
from tests.unit.router._router_harness import (
    SCRIPT_TEXT,
    router,
    run,
    script_ids,
    sse_events,
    tiny_hf,
    tiny_path,
)

PROMPT = "The router says"


def _decode(ids: list[int]) -> str:
    return tiny_hf().decode(ids, skip_special_tokens=True)


# --- native /generate ---


def test_native_non_stream_matches_sglang_shape(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            resp = await h.client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 64}})
            assert resp.status_code == 200, resp.text
            out = resp.json()
            assert set(out) == {"text", "output_ids", "meta_info"}
            assert out["output_ids"] == script_ids() and out["text"] == SCRIPT_TEXT
            meta = out["meta_info"]
            (submit,) = h.workers[0].submits
            assert meta["id"] == submit.rid and len(meta["id"]) == 32  # uuid4 hex
            assert meta["prompt_tokens"] == len(tiny_hf().encode(PROMPT)) == len(submit.input_ids)
            assert meta["completion_tokens"] == len(script_ids())
            assert meta["finish_reason"] == {"type": "length", "length": 64}
            assert meta["cached_tokens"] == 3 and meta["weight_version"] == "default"  # the worker's, passed on
            assert meta["e2e_latency"] > 0 and meta["workers"] == ["w0"]
            assert meta["slo"]["tier"] == "admitted" and meta["slo"]["attained"]["overall"] is True
            assert meta["slo"]["output_tokens"] == len(script_ids())
            assert meta["worker_slo"] == {"tier": "admitted", "from": "w0"}
            assert submit.input_ids == tuple(tiny_hf().encode(PROMPT))
            assert submit.sampling_params == {"max_new_tokens": 64}
            assert (
                submit.slo is not None
                and submit.slo.to_dict() == {"class": "best_effort", "weight": 1.0}
                and submit.arrival_unix is not None
            )
            # the default's recent-answers history (beside its trained table) learned this answer's length
            history = h.service.predictor.histories["history"]
            assert list(history._global) == [len(script_ids())]

    run(go)


def test_native_stream_is_cumulative_and_ends_with_done(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            body = {"input_ids": [5, 6, 7], "stream": True, "rid": "abc", "slo": {"ttft_ms": 5000, "tpot_ms": 1000}}
            resp = await h.client.post("/generate", json=body)
            assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
            events = sse_events(resp.content)
            assert events[-1] == "[DONE]"
            chunks = events[:-1]
            ids = script_ids()
            for chunk in chunks:  # cumulative: SGLang's default stream
                n = chunk["meta_info"]["completion_tokens"]
                assert chunk["output_ids"] == ids[:n] and chunk["meta_info"]["id"] == "abc"
                assert SCRIPT_TEXT.startswith(chunk["text"])
            assert [c["meta_info"]["finish_reason"] for c in chunks[:-1]] == [None] * (len(chunks) - 1)
            last = chunks[-1]
            assert last["text"] == SCRIPT_TEXT and last["output_ids"] == ids
            assert last["meta_info"]["finish_reason"]["type"] == "length"
            assert last["meta_info"]["finish_reason"]["length"] == DEFAULT_MAX_NEW_TOKENS
            assert last["meta_info"]["slo"]["spec"] == {
                "class": "latency",
                "weight": 1.0,
                "ttft_ms": 5000.0,
                "tpot_ms": 1000.0,
            }
            assert last["meta_info"]["slo"]["attained"]["overall"] is True
            (submit,) = h.workers[0].submits
            assert submit.rid == "abc" and submit.input_ids == (5, 6, 7)
            assert submit.slo is not None
            assert submit.slo.to_dict() == {"class": "latency", "weight": 1.0, "ttft_ms": 5000.0, "tpot_ms": 1000.0}
            assert submit.sampling_params["max_new_tokens"] == DEFAULT_MAX_NEW_TOKENS

    run(go)


def test_native_incremental_stream_sends_deltas(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, incremental_streaming_output=True) as h:
            resp = await h.client.post("/generate", json={"input_ids": [5, 6], "stream": True})
            chunks = sse_events(resp.content)[:-1]
            assert "".join(c["text"] for c in chunks) == SCRIPT_TEXT
            assert [t for c in chunks for t in c["output_ids"]] == script_ids()

    run(go)


def test_slo_comes_from_custom_params_or_headers_and_is_scored_by_the_router(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"delay_s": 0.05}]) as h:
            body = {"input_ids": [5], "sampling_params": {"custom_params": {"slo": {"ttft_ms": 1}, "x": 1}}}
            resp = await h.client.post("/generate", json=body)
            report = resp.json()["meta_info"]["slo"]
            assert report["spec"]["ttft_ms"] == 1.0 and report["attained"]["ttft"] is False  # the router's own clock
            submit = h.workers[0].submits[0]
            assert submit.sampling_params["custom_params"] == {"x": 1}  # the SLO travels in Submit.slo only
            assert submit.slo is not None and submit.slo.ttft_ms == 1.0
            resp = await h.client.post("/generate", json={"input_ids": [5]}, headers={"x-slo-deadline-ms": "60000"})
            assert resp.json()["meta_info"]["slo"]["spec"]["class"] == "deadline"
            status = (await h.client.get("/slo/status")).json()
            assert status["attainment"]["latency"]["missed"] == 1
            assert status["attainment"]["deadline"]["attained"] == 1

    run(go)


def test_stop_token_and_stop_string_are_trimmed_from_text_like_sglang(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        ids = script_ids()
        async with router(ctx, [{"stop": ids[-1]}, {"stop": "日本", "worker_id": "w1"}]) as h:
            out = (await h.client.post("/generate", json={"input_ids": [5]})).json()
            assert out["output_ids"] == ids and out["text"] == _decode(ids[:-1])  # the stop token is not text
            assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ids[-1]}
            out = (await h.client.post("/generate", json={"input_ids": [5]})).json()
            assert out["text"] == SCRIPT_TEXT[: SCRIPT_TEXT.find("日本")]
            assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": "日本"}

    run(go)


def test_zero_max_new_tokens_needs_no_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:  # what SGLang frontend programs send to commit a prefix
        async with router(ctx) as h:
            resp = await h.client.post("/generate", json={"text": PROMPT, "sampling_params": {"max_new_tokens": 0}})
            out = resp.json()
            assert resp.status_code == 200 and out["text"] == "" and out["output_ids"] == []
            assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
            assert h.workers[0].submits == []

    run(go)


def test_bad_native_requests_are_400s_naming_the_field(ctx: zmq.asyncio.Context) -> None:
    cases: list[tuple[Any, str]] = [
        ({"text": ["a", "b"]}, "text"),
        ({"input_ids": [[1, 2], [3]]}, "input_ids"),
        ({"input_ids": [1, -2]}, "input_ids[1]"),
        ({"input_ids": []}, "input_ids"),
        ({"text": "a", "input_ids": [1]}, "input_ids"),
        ({}, "text"),
        ({"text": "a", "return_logprob": True}, "return_logprob"),
        ({"text": "a", "image_data": "http://x/y.png"}, "image_data"),
        ({"text": "a", "sampling_params": [{}]}, "sampling_params"),
        ({"text": "a", "sampling_params": {"n": 2}}, "sampling_params.n"),
        ({"text": "a", "sampling_params": {"max_new_tokens": -1}}, "sampling_params.max_new_tokens"),
        ({"text": "a", "stream": "yes"}, "stream"),
        ({"text": "a", "rid": ["r1"]}, "rid"),
        ({"text": "a", "slo": {"ttft_ms": -5}}, "slo.ttft_ms"),
        ({"text": "a", "slo": {"bogus": 1}}, "slo.bogus"),
        (
            {"text": "a", "sampling_params": {"custom_params": {"slo": {"tpot_ms": 5}}}},
            "sampling_params.custom_params.slo.ttft_ms",
        ),
        ([1, 2], "body"),
    ]

    async def go() -> None:
        async with router(ctx) as h:
            for body, field in cases:
                resp = await h.client.post("/generate", json=body)
                assert resp.status_code == 400, (body, resp.text)
                assert resp.json()["error"]["param"] == field, (body, resp.json())
            resp = await h.client.post("/generate", content=b"{not json")
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "body"
            resp = await h.client.post("/generate", json={"text": "a"}, headers={"x-slo-ttft-ms": "soon"})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "x-slo-ttft-ms"
            assert h.workers[0].submits == []
            # what bench_serving sends explicitly is fine when off
            body = {"text": "a", "return_logprob": False, "lora_path": None, "logprob_start_len": -1, "stream": False}
            assert (await h.client.post("/generate", json=body)).status_code == 200

    run(go)


def test_a_rid_already_in_flight_is_a_400(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"chunk": 1, "delay_s": 0.03}]) as h:
            first = asyncio.ensure_future(h.client.post("/generate", json={"input_ids": [1], "rid": "dup"}))
            await until(lambda: h.service.registry.worker_of("dup") is not None)
            resp = await h.client.post("/generate", json={"input_ids": [1], "rid": "dup"})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "rid"
            assert (await first).status_code == 200

    run(go)


def test_worker_4xx_is_passed_through_before_the_stream_starts(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"error_status": 400}]) as h:
            for stream in (False, True):
                resp = await h.client.post("/generate", json={"input_ids": [1] * 10, "stream": stream})
                assert resp.status_code == 400, resp.text
                assert "The input is too long." in resp.json()["error"]["message"]
            status = (await h.client.get("/slo/status")).json()
            assert status["attainment"]["best_effort"]["dropped"] == 2

    run(go)


def test_an_error_after_the_stream_started_is_a_final_sse_error_event(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"error_status": 422, "error_after": 2}]) as h:
            resp = await h.client.post("/generate", json={"input_ids": [1], "stream": True})
            assert resp.status_code == 200
            events = sse_events(resp.content)
            assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == 422
            assert "worker gave up" in events[-2]["error"]["message"]
            assert all("text" in e for e in events[:-2]) and len(events) == 4

    run(go)


def test_no_worker_is_a_503_and_health_says_so(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [], admission_timeout_s=0.2) as h:
            resp = await h.client.post("/generate", json={"input_ids": [1, 2]})
            assert resp.status_code == 503 and resp.json()["error"]["code"] == 503
            resp = await h.client.post("/generate", json={"text": "needs a tokenizer path"})
            assert resp.status_code == 503
            for path in ("/health", "/health_generate"):
                assert (await h.client.get(path)).status_code == 503
            assert (await h.client.get("/get_model_info")).status_code == 503
            await h.add_worker(ctx, "w0")
            assert (await h.client.get("/health")).status_code == 200
            assert (await h.client.post("/generate", json={"input_ids": [1, 2]})).status_code == 200

    run(go)


def test_client_disconnect_mid_stream_aborts_on_the_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"chunk": 1, "delay_s": 0.05}]) as h:
            body = orjson.dumps({"input_ids": [1], "stream": True, "rid": "gone"})
            sent: list[dict[str, Any]] = []
            first_body = asyncio.Event()

            async def disconnect_once_streaming() -> dict[str, Any]:
                await first_body.wait()
                return {"type": "http.disconnect"}

            receive = replay_body(body, disconnect_once_streaming)

            async def send(message: dict[str, Any]) -> None:
                sent.append(message)
                if message["type"] == "http.response.body" and message.get("body"):
                    first_body.set()

            scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                     "method": "POST", "path": "/generate", "raw_path": b"/generate", "query_string": b"",
                     "headers": [(b"content-type", b"application/json")], "server": ("router", 80),
                     "client": ("test", 1), "scheme": "http", "root_path": ""}  # fmt: skip
            await h.app(scope, receive, send)
            assert sent[0]["status"] == 200
            await until(lambda: h.workers[0].aborts == ["gone"])
            status = h.service.dispatcher.status()
            assert status["cancelled"] == 1 and status["inflight"] == 0
            assert h.service.reports.attainment()["best_effort"]["dropped"] == 1

    run(go)


# --- OpenAI ---


def _openai(h: Any) -> openai.AsyncOpenAI:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(h.app), base_url="http://router/v1")
    return openai.AsyncOpenAI(api_key=h.service.config.api_key or "none", base_url="http://router/v1", http_client=http)


def test_openai_completions_stream_and_not(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            client = _openai(h)
            out = await client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0)
            assert out.choices[0].text == SCRIPT_TEXT and out.choices[0].finish_reason == "length"
            assert out.usage.completion_tokens == len(script_ids())
            assert out.usage.prompt_tokens == len(tiny_hf().encode(PROMPT)) and out.model == "tiny"
            assert out.model_extra["slo"]["tier"] == "admitted"
            submit = h.workers[0].submits[0]
            assert submit.sampling_params == {"max_new_tokens": 40, "temperature": 0}
            stream = await client.completions.create(
                model="tiny",
                prompt=[5, 6, 7],
                stream=True,
                stream_options={"include_usage": True},
                extra_body={"slo": {"deadline_ms": 9000}},
            )
            chunks = [c async for c in stream]
            text_chunks = [c for c in chunks if c.choices]
            assert h.workers[0].submits[1].sampling_params["max_new_tokens"] == 16  # OpenAI's default
            assert "".join(c.choices[0].text for c in text_chunks) == _decode(script_ids()[:16])
            assert text_chunks[-1].choices[0].finish_reason == "length"
            assert text_chunks[-1].model_extra["slo"]["spec"]["deadline_ms"] == 9000.0
            assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16

    run(go)


def test_openai_chat_applies_the_chat_template(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            client = _openai(h)
            messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
            out = await client.chat.completions.create(model="tiny", messages=messages, max_tokens=30)
            assert out.choices[0].message.content == SCRIPT_TEXT and out.choices[0].message.role == "assistant"
            assert out.usage.total_tokens == out.usage.prompt_tokens + len(script_ids())
            assert out.model_extra["slo"]["attained"]["overall"] is True
            rendered = tiny_hf().apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert h.workers[0].submits[0].input_ids == tuple(tiny_hf().encode(rendered, add_special_tokens=False))
            stream = await client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                stream=True,
                stream_options={"include_usage": True},
                extra_headers={"x-slo-ttft-ms": "5000"},
            )
            chunks = [c async for c in stream]
            assert chunks[0].choices[0].delta.role == "assistant"
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            assert content == SCRIPT_TEXT
            finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
            assert len(finish) == 1 and finish[0].choices[0].finish_reason == "length"
            assert finish[0].model_extra["slo"]["spec"]["ttft_ms"] == 5000.0
            assert chunks[-1].usage.prompt_tokens == len(h.workers[0].submits[1].input_ids)

    run(go)


def test_openai_bad_requests_name_the_field(ctx: zmq.asyncio.Context) -> None:
    cases = [
        ("/v1/completions", {"prompt": "a", "n": 2}, "n"),
        ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
        ("/v1/completions", {"prompt": "a", "echo": True}, "echo"),
        ("/v1/completions", {"prompt": "a", "max_tokens": "many"}, "max_tokens"),
        ("/v1/completions", {"prompt": "a", "slo": {"class": "soon"}}, "slo.class"),
        ("/v1/chat/completions", {"messages": []}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 3}, "n"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools",
        ),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True}, "logprobs"),
    ]

    async def go() -> None:
        async with router(ctx) as h:
            for path, body, field in cases:
                resp = await h.client.post(path, json=body)
                assert resp.status_code == 400 and resp.json()["error"]["param"] == field, (body, resp.text)
            assert h.workers[0].submits == []

    run(go)


# --- operations ---


WORKER_SECRET = b"the workers' own secret, not the client key"


def test_api_key_guards_every_route_but_health(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}], api_key="sekret", worker_secret=WORKER_SECRET) as h:
            bare = httpx.AsyncClient(transport=httpx.ASGITransport(h.app), base_url="http://router")
            for path in ("/generate", "/slo/status", "/metrics", "/get_model_info"):
                resp = await (bare.post(path, json={"input_ids": [1]}) if path == "/generate" else bare.get(path))
                assert resp.status_code == 401, path
            wrong = await bare.get("/slo/status", headers={"Authorization": "Bearer nope"})
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == 401
            assert (await bare.get("/health")).status_code == 200
            assert (await h.client.post("/generate", json={"input_ids": [1]})).status_code == 200
            out = await _openai(h).completions.create(model="m", prompt="a", max_tokens=64)
            assert out.choices[0].text == SCRIPT_TEXT
            await bare.aclose()
            intruder = await h.add_worker(ctx, "w9", secret=b"a guess, sixteen+ bytes", wait=False)
            await until(lambda: bool(intruder.acks))
            assert intruder.acks[0].accepted is False and "w9" not in h.service.registry.worker_ids()
            keyless = await h.add_worker(ctx, "w8", secret=None, wait=False)  # the client key is no credential
            await asyncio.sleep(0.3)
            assert not keyless.registered.is_set() and "w8" not in h.service.registry.worker_ids()

    run(go)


def test_migrate_moves_a_running_request_without_gaps(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"chunk": 1, "delay_s": 0.03}, {"chunk": 1}]) as h:
            task = asyncio.ensure_future(h.client.post("/generate", json={"input_ids": [1], "rid": "m1"}))
            await until(lambda: len(h.workers[0].submits) == 1)
            await asyncio.sleep(0.1)
            resp = await h.client.post("/slo/migrate", json={"rid": "m1", "to": "w1"})
            assert resp.status_code == 200 and resp.json() == {"rid": "m1", "from": "w0", "to": "w1", "migrated": True}
            out = (await task).json()
            assert out["output_ids"] == script_ids() and out["text"] == SCRIPT_TEXT
            assert out["meta_info"]["workers"] == ["w0", "w1"] and out["meta_info"]["prompt_tokens"] == 1
            assert out["meta_info"]["finish_reason"]["length"] == DEFAULT_MAX_NEW_TOKENS
            assert len(h.workers[1].submits[0].resume_output_ids) > 0 and "m1" in h.workers[0].aborts
            missing = await h.client.post("/slo/migrate", json={"rid": "nope", "to": "w1"})
            assert missing.status_code == 404 and missing.json()["error"]["param"] == "rid"
            task = asyncio.ensure_future(h.client.post("/generate", json={"input_ids": [1], "rid": "m2"}))
            await until(lambda: h.service.registry.worker_of("m2") is not None)
            for body, field in (({"rid": "m2", "to": "w7"}, "to"), ({"to": "w1"}, "rid"), ({"rid": "m2"}, "to")):
                resp = await h.client.post("/slo/migrate", json=body)
                assert resp.status_code == 400 and resp.json()["error"]["param"] == field
            assert (await task).status_code == 200

    run(go)


def test_status_and_metrics(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        params = {"tiers_ms": [50, 200]}
        async with router(ctx, [{}, {}], routing_policy="polyserve", policy_params=params) as h:
            body = {"input_ids": [1], "slo": {"ttft_ms": 5000, "tpot_ms": 100}}
            assert (await h.client.post("/generate", json=body)).status_code == 200
            status = (await h.client.get("/slo/status")).json()
            assert status["policy"] == "polyserve" and status["policy_params"] == params
            assert status["dispatcher"]["completed"] == 1 and "decision_ns" in status["dispatcher"]
            assert [w["worker_id"] for w in status["workers"]] == ["w0", "w1"]
            w0 = status["workers"][0]
            assert w0["healthy"] is True and w0["http_url"] == "http://w0.test" and "kv_capacity_tokens" in w0
            assert "50" in status["policy_status"]["tiers"]  # PolyServe's per-tier autoscaling signals
            assert status["attainment"]["latency"]["attained"] == 1 and status["tokenizer"]["loaded"] is True
            metrics = (await h.client.get("/metrics")).text
            assert 'sglang_slo_router_events_total{event="completed"} 1.0' in metrics
            assert 'sglang_slo_router_worker_healthy{gpu="cpu",worker="w0"} 1.0' in metrics
            assert 'sglang_slo_requests_total{result="attained",slo_class="latency"} 1.0' in metrics
            assert "sglang_slo_router_decision_seconds" in metrics and "sglang_slo_router_routed_total" in metrics
            assert 'sglang_slo_router_tier_instances{tier_ms="50"}' in metrics  # the autoscaling signals too
            assert 'sglang_slo_router_tier_events_total{event="routed",tier_ms="50"} 1.0' in metrics

    run(go)


def test_worker_info_routes_proxy_a_healthy_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}, {}]) as h:
            for path in ("/get_model_info", "/model_info"):
                info = (await h.client.get(path)).json()
                assert info["model_path"].endswith("tiny-llama-0")
            server = (await h.client.get("/get_server_info")).json()
            assert server["internal_states"] == [{"worker": "w0"}]
            assert server["router"]["policy"] == "round_robin" and server["router"]["workers"] == ["w0", "w1"]
            models = (await h.client.get("/v1/models")).json()
            assert models["data"][0]["object"] == "model"
            assert (await h.client.post("/flush_cache")).status_code == 200
            assert ("POST", "w1.test/flush_cache") in h.http.calls
            h.http.flush_status["w1"] = 400
            resp = await h.client.post("/flush_cache")
            assert resp.status_code == 500 and resp.json()["workers"]["w0"] == "ok"

    run(go)


def test_internal_keys_a_client_sets_never_reach_a_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            custom = {"slo_arrival": 1.0, "slo_token_ts": [0], "slo_oracle_output_len": 3, "x": 1}
            resp = await h.client.post(
                "/generate", json={"input_ids": [5], "sampling_params": {"custom_params": custom}}
            )
            assert resp.status_code == 200
            sent = h.workers[0].submits[0].sampling_params["custom_params"]
            assert sent == {"slo_oracle_output_len": 3, "x": 1}

    run(go)


def test_a_prompt_longer_than_every_workers_model_is_refused_at_the_router(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"max_input_tokens": 8}, {"max_input_tokens": 10}]) as h:
            ok = await h.client.post("/generate", json={"input_ids": [5] * 10})
            assert ok.status_code == 200
            resp = await h.client.post("/generate", json={"input_ids": [5] * 11})
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "input_ids"
            assert "context" in resp.json()["error"]["message"]

    run(go)


def test_chat_template_kwargs_are_allow_listed(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
            ok = await h.client.post(
                "/v1/chat/completions", json={**chat, "chat_template_kwargs": {"enable_thinking": False}}
            )
            assert ok.status_code == 200, ok.text
            for kwargs, param in (
                ({"add_generation_prompt": False}, "chat_template_kwargs.add_generation_prompt"),
                ({"enable_thinking": {"nested": 1}}, "chat_template_kwargs.enable_thinking"),
                ({"thinking": "x" * 65}, "chat_template_kwargs.thinking"),
                ([1], "chat_template_kwargs"),
            ):
                resp = await h.client.post("/v1/chat/completions", json={**chat, "chat_template_kwargs": kwargs})
                assert resp.status_code == 400 and resp.json()["error"]["param"] == param, resp.text
            assert h.workers[0].submits and len(h.workers[0].submits) == 1

    run(go)


def test_a_slow_tokenization_is_a_400_and_the_loop_stays_free(
    ctx: zmq.asyncio.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time as _time

    from router import requests as router_requests

    class Slow:
        def __init__(self, hf: Any) -> None:
            self.hf = hf

        def __getattr__(self, name: str) -> Any:
            return getattr(self.hf, name)

        def encode(self, text: str, **kw: Any) -> Any:
            if "slow" in text:
                _time.sleep(1.0)
            return self.hf.encode(text, **kw)

    monkeypatch.setattr(router_requests, "TOKENIZE_TIMEOUT_S", 0.2)

    async def go() -> None:
        async with router(ctx, tokenizer=RouterTokenizer(tiny_path(), tokenizer=Slow(tiny_hf()))) as h:
            started = asyncio.get_running_loop().time()
            slow, fast = await asyncio.gather(
                h.client.post("/generate", json={"text": "slow text"}),
                h.client.post("/generate", json={"input_ids": [5]}),
            )
            assert slow.status_code == 400 and slow.json()["error"]["param"] == "text"
            assert "longer than" in slow.json()["error"]["message"]
            assert fast.status_code == 200
            assert asyncio.get_running_loop().time() - started < 1.0  # nobody waited for the slow one

    run(go)
