"""The worker's HTTP edge against poison sampling params: a value SGLang would crash its
scheduler or detokenizer on, or answer with a 500, is a 400 naming the field on the native route
(the batch form and the Vertex envelope included) and never reaches SGLang; a real client's
params pass. The middleware runs in front of a recording stand-in app."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.unit.server.middleware_harness import Response, call, make_middleware, refused


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"5": "x"}}}, "sampling_params.logit_bias.5"),
        ("/generate", {"text": "x", "sampling_params": {"ignore_eos": "x"}}, "sampling_params.ignore_eos"),
        ("/generate", {"text": "x", "sampling_params": {"nil": 1}}, "sampling_params.nil"),
        ("/generate", {"text": ["x", "y"], "sampling_params": [{}, {"stop": 5}]}, "sampling_params[1].stop"),
        ("/generate", {"text": "x", "sampling_params": []}, "sampling_params"),
        ("/generate", {"text": "x", "return_hidden_states": []}, "return_hidden_states"),
        ("/generate", {"text": "x", "return_logprob": "x"}, "return_logprob"),
        (
            "/vertex_generate",
            {"instances": [{"text": "x"}], "parameters": {"sampling_params": {"temperature": "x"}}},
            "parameters.sampling_params.temperature",
        ),
    ],
)  # fmt: skip
def test_a_poison_sampling_param_is_a_400_and_never_reaches_sglang(path: str, body: dict[str, Any], param: str) -> None:
    assert refused(path, orjson.dumps(body))["param"] == param


def test_real_clients_params_pass() -> None:
    mw, inner, _ = make_middleware()
    params = {"max_new_tokens": 8, "temperature": 0, "top_p": 1, "stop": ["\n"], "logit_bias": {"5": -100}}
    body = {"text": "x", "sampling_params": params, "return_logprob": True, "stream": False}
    assert Response(call(mw, "POST", "/generate", orjson.dumps(body))).status == 200
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["logit_bias"] == {"5": -100}
