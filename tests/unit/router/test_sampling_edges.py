"""The router's edge holds sampling params to what SGLang can run: a value that would crash a
worker's scheduler or detokenizer (a string logit bias, a string skip_special_tokens) or 500 it
(an unknown key, a string temperature) is a 400 naming the field and never reaches a worker, on
the native and the OpenAI routes; what real clients send is forwarded as it is."""

from __future__ import annotations

from typing import Any

import pytest
import zmq.asyncio

from tests.unit.router._router_harness import assert_refused_before_any_worker, router, run, tiny_hf

CHAT = [{"role": "user", "content": "x"}]
SP = "sampling_params"


@pytest.fixture(autouse=True, scope="module")
def _tokenizer_loaded() -> None:
    """Load the tiny tokenizer before any test's time limit starts (a slow host takes a while)."""
    tiny_hf()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/generate", {"text": "a", "sampling_params": {"logit_bias": {"5": "x"}}}, "sampling_params.logit_bias.5"),
        ("/generate", {"input_ids": [1], SP: {"logit_bias": {"5": None}}}, f"{SP}.logit_bias.5"),
        ("/generate", {"text": "a", SP: {"skip_special_tokens": "x"}}, f"{SP}.skip_special_tokens"),
        ("/generate", {"text": "a", "sampling_params": {"nil": 1}}, "sampling_params.nil"),
        ("/generate", {"text": "a", "sampling_params": {"temperature": "x"}}, "sampling_params.temperature"),
        ("/generate", {"text": "a", "sampling_params": {"stop": 5}}, "sampling_params.stop"),
        ("/generate", {"text": "a", "sampling_params": {"top_k": 2**40}}, "sampling_params.top_k"),
        ("/v1/completions", {"prompt": "a", "logit_bias": {"5": "x"}}, "logit_bias.5"),
        ("/v1/completions", {"prompt": "a", "seed": 2**64}, "seed"),
        ("/v1/chat/completions", {"messages": CHAT, "logit_bias": {"5": 1e300}}, "logit_bias.5"),
        ("/v1/chat/completions", {"messages": CHAT, "skip_special_tokens": "x"}, "skip_special_tokens"),
        ("/v1/chat/completions", {"messages": CHAT, "min_tokens": "x"}, "min_tokens"),
    ],
)  # fmt: skip
def test_a_poison_sampling_param_is_a_400_and_never_reaches_a_worker(
    ctx: zmq.asyncio.Context, path: str, body: dict[str, Any], field: str
) -> None:
    assert_refused_before_any_worker(ctx, path, body, field)


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/generate", {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 4, "logit_bias": {"5": -100}}}),
        ("/v1/completions", {"prompt": "a", "max_tokens": 4, "logit_bias": {"5": -100}}),
    ],
)
def test_a_good_logit_bias_reaches_the_worker(ctx: zmq.asyncio.Context, path: str, body: dict[str, Any]) -> None:
    async def go() -> None:
        async with router(ctx) as h:
            assert (await h.client.post(path, json=body)).status_code == 200
            assert h.workers[0].submits[0].sampling_params["logit_bias"] == {"5": -100}

    run(go)
