"""The router's edge against poison and for retries: a stop_regex that could stall a worker's
scheduler loop is a 400 naming the field on every route (and never reaches a worker), a body
nested deeper than the worker link can carry is a 400 naming `body`, and the router's own 503,
502 and 504 say why (`reason`) and when to come back (Retry-After)."""

from __future__ import annotations

from typing import Any

import pytest
import zmq.asyncio

from tests.unit.router._router_harness import assert_refused_before_any_worker, router, run, tiny_hf

CHAT = [{"role": "user", "content": "x"}]


@pytest.fixture(autouse=True, scope="module")
def _tokenizer_loaded() -> None:
    """Load the tiny tokenizer before any test's time limit starts (a slow host takes a while)."""
    tiny_hf()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"text": "a", "sampling_params": {"stop_regex": "(a+)+$"}}, "sampling_params.stop_regex"),
        (
            "/generate",
            {"input_ids": [1, 2], "sampling_params": {"stop_regex": ["\n\n", "(x|x)*y"]}},
            "sampling_params.stop_regex[1]",
        ),
        ("/generate", {"text": "a", "sampling_params": {"stop_regex": "(?P<a>x)(?P=a)"}}, "sampling_params.stop_regex"),
        ("/v1/completions", {"prompt": "a", "stop_regex": r"(\w+\s?)*$"}, "stop_regex"),
        ("/v1/chat/completions", {"messages": CHAT, "stop_regex": ["(.*a){12}"]}, "stop_regex[0]"),
        ("/v1/chat/completions", {"messages": CHAT, "stop_regex": "["}, "stop_regex"),
    ],
)
def test_a_catastrophic_stop_regex_is_a_400_naming_the_field(
    ctx: zmq.asyncio.Context, path: str, body: dict[str, Any], field: str
) -> None:
    assert_refused_before_any_worker(ctx, path, body, field)


def test_a_bounded_stop_regex_reaches_the_worker(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "stop_regex": r"\n\s{0,8}\n"}}
            assert (await h.client.post("/generate", json=body)).status_code == 200
            assert h.workers[0].submits[0].sampling_params["stop_regex"] == r"\n\s{0,8}\n"

    run(go)


def _nested(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        value = {"k": value}
    return value


def test_a_body_nested_deeper_than_the_worker_link_carries_is_a_400(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            deep = {"input_ids": [1, 2], "sampling_params": {"custom_params": _nested(300)}}
            resp = await h.client.post("/generate", json=deep)
            assert resp.status_code == 400 and resp.json()["error"]["param"] == "body", resp.text
            assert "nested deeper" in resp.json()["error"]["message"] and h.workers[0].submits == []
            fine = {"input_ids": [1, 2], "sampling_params": {"custom_params": _nested(20)}}
            assert (await h.client.post("/generate", json=fine)).status_code == 200

    run(go)


def _assert_retryable(resp: Any, status: int, reason: str) -> None:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["reason"] == reason and error["retry_after_s"] >= 1
    assert int(resp.headers["retry-after"]) == error["retry_after_s"]


def test_no_worker_is_a_503_with_a_reason_and_retry_after(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [], admission_timeout_s=0.2) as h:
            _assert_retryable(await h.client.post("/generate", json={"input_ids": [1, 2]}), 503, "no_worker")
            _assert_retryable(await h.client.get("/get_model_info"), 503, "no_worker")

    run(go)


def test_a_failed_worker_is_a_502_with_a_reason_and_retry_after(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"error_status": 502}]) as h:
            _assert_retryable(await h.client.post("/generate", json={"input_ids": [1, 2]}), 502, "worker_failed")

    run(go)


def test_a_request_without_progress_is_a_504_with_a_reason_and_retry_after(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{"delay_s": 60.0}], request_timeout_s=0.4) as h:
            _assert_retryable(await h.client.post("/generate", json={"input_ids": [1, 2]}), 504, "timeout")

    run(go)
