"""The worker's HTTP edge against poison: a stop_regex that could stall the scheduler loop is a
400 naming the field on every generate route (the native batch form and the Vertex envelope
included), a bounded one passes, and a body nested deeper than can be handed on to SGLang is a
400 naming `body` instead of a 500. The middleware runs in front of a recording stand-in app."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from tests.unit.server.middleware_harness import Response, call, make_middleware, refused


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/generate", {"text": "x", "sampling_params": {"stop_regex": "(a+)+$"}}, "sampling_params.stop_regex"),
        (
            "/generate",
            {"text": ["x", "y"], "sampling_params": [{}, {"stop_regex": ["ok", "(a|a)*b"]}]},
            "sampling_params[1].stop_regex[1]",
        ),
        ("/v1/completions", {"prompt": "x", "stop_regex": "(x+x+)+y"}, "stop_regex"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "stop_regex": "[a-z]+\\d"},
            "stop_regex",
        ),
        (
            "/vertex_generate",
            {"instances": [{"text": "x"}], "parameters": {"sampling_params": {"stop_regex": "(.*)*x"}}},
            "parameters.sampling_params.stop_regex",
        ),
    ],
)
def test_an_unbounded_stop_regex_is_a_400_and_never_reaches_sglang(path: str, body: dict[str, Any], param: str) -> None:
    assert refused(path, orjson.dumps(body))["param"] == param


def test_a_bounded_stop_regex_passes() -> None:
    mw, inner, _ = make_middleware()
    body = {"text": "x", "sampling_params": {"stop_regex": ["\n\n", "Answer: [A-D]"]}}
    assert Response(call(mw, "POST", "/generate", orjson.dumps(body))).status == 200
    assert orjson.loads(inner.calls[0]["body"])["sampling_params"]["stop_regex"] == ["\n\n", "Answer: [A-D]"]


def test_a_body_too_deep_to_hand_on_is_a_400_naming_body() -> None:
    deep = b'{"text": "x", "sampling_params": {"custom_params": ' + b'{"a": ' * 300 + b"1" + b"}" * 300 + b"}}"
    assert refused("/generate", deep)["param"] == "body"
