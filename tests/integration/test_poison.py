"""Poison containment on a real worker (tiny model, CPU, one shared server): a stop_regex that
would backtrack without end inside SGLang's scheduler loop is a 400 naming the field on the
native and OpenAI routes, the worker serves the next request as if nothing happened, a bounded
stop_regex still stops generation in SGLang, a body outside SGLang's own contract is a 400 naming
its field, and the worker's queue is bounded by default."""

from __future__ import annotations

from typing import Any

import pytest
import requests

from launch_server import DEFAULT_MAX_QUEUED_REQUESTS
from server.process import ServerProcess

PROMPT = "the capital of france is"


def _post(server: ServerProcess, path: str, body: dict[str, object]) -> requests.Response:
    return requests.post(server.url + path, json=body, timeout=120)


def test_a_catastrophic_stop_regex_is_refused_and_the_worker_keeps_serving(tiny_server: ServerProcess) -> None:
    evil = {"text": PROMPT, "sampling_params": {"max_new_tokens": 64, "stop_regex": "(a+)+$"}}
    r = _post(tiny_server, "/generate", evil)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "sampling_params.stop_regex"
    r = _post(tiny_server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "stop_regex": ["ok", "(x|x)*y"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stop_regex[1]", r.text

    plain = _post(
        tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}}
    )
    assert plain.status_code == 200, plain.text
    assert plain.json()["meta_info"]["completion_tokens"] == 6


def test_an_empty_prompt_is_a_400_and_the_worker_keeps_serving(tiny_server: ServerProcess) -> None:
    """A prompt of no tokens reached the model's forward, which took the scheduler down."""
    for path, body in (("/generate", {"text": ""}), ("/v1/completions", {"prompt": "", "max_tokens": 4})):
        r = _post(tiny_server, path, body)
        assert r.status_code == 400, (path, r.status_code, r.text)
        assert "empty" in r.text, r.text
    plain = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 4}})
    assert plain.status_code == 200, plain.text


def test_a_rid_that_is_not_a_string_is_a_400_and_the_worker_keeps_serving(tiny_server: ServerProcess) -> None:
    """SGLang keyed its request table by a list rid and answered 500 (found by the schema fuzzer)."""
    for rid in (["a", "b"], [["a"]], 7):
        r = _post(tiny_server, "/generate", {"text": PROMPT, "rid": rid, "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 400, (rid, r.status_code, r.text)
        assert "rid" in r.text, r.text
    batch = _post(
        tiny_server,
        "/generate",
        {"text": [PROMPT, PROMPT], "rid": ["b1", "b2"], "sampling_params": {"max_new_tokens": 2}},
    )
    assert batch.status_code == 200, batch.text
    plain = _post(tiny_server, "/generate", {"text": PROMPT, "rid": "one", "sampling_params": {"max_new_tokens": 2}})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"max_thinking_tokens": -280}, "max_thinking_tokens"),
        ({"bootstrap_room": "x"}, "bootstrap_room"),
        ({"text": 5}, "text"),
    ],
    ids=["negative_thinking_budget", "string_room", "number_text"],
)
def test_a_body_outside_sglangs_contract_is_a_400_naming_the_field(
    tiny_server: ServerProcess, extra: dict[str, Any], field: str
) -> None:
    """SGLang's contract gate answers these with a bare-string error naming no field (found by
    the schema fuzzer); the edge names the field in the error object, and the worker serves on."""
    r = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}, **extra})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert isinstance(error, dict) and error["param"] == field and error["message"], r.text
    plain = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize("field", ["custom_logit_processor", "bootstrap_room", "lora_id"])
def test_a_batch_field_with_fewer_entries_than_prompts_is_a_400(tiny_server: ServerProcess, field: str) -> None:
    """SGLang indexes these per prompt without checking their length: a short list ended in an
    IndexError and a 500 (found by the schema fuzzer)."""
    body = {"text": [PROMPT, PROMPT, PROMPT], "sampling_params": {"max_new_tokens": 2}, field: [None]}
    r = _post(tiny_server, "/generate", body)
    assert r.status_code == 400, r.text
    assert field in r.json()["error"]["message"], r.text
    body[field] = [None, None, None]
    assert _post(tiny_server, "/generate", body).status_code == 200


@pytest.mark.parametrize(
    ("field", "value"), [("return_hidden_states", [False]), ("return_logprob", [True]), ("top_logprobs_num", [1])]
)
def test_a_per_prompt_list_on_one_prompt_is_a_400_and_the_worker_keeps_serving(
    tiny_server: ServerProcess, field: str, value: list[Any]
) -> None:
    """A one-entry list where one prompt takes a value passed SGLang's tokenizer-side checks and
    reached the scheduler's request, whose check then ended the scheduler (found by the fuzzer)."""
    r = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}, field: value})
    assert r.status_code == 400, r.text
    assert field in r.text, r.text
    plain = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert plain.status_code == 200, plain.text


def test_a_bounded_stop_regex_still_stops_generation(tiny_server: ServerProcess) -> None:
    params = {"max_new_tokens": 48, "temperature": 0}
    free = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": params}).json()
    text = free["text"]
    assert len(text) >= 2, free
    marker = text[1]  # a character the greedy answer is known to produce
    pattern = "[" + ("\\" + marker if not marker.isalnum() else marker) + "\x00]"
    stopped = _post(tiny_server, "/generate", {"text": PROMPT, "sampling_params": {**params, "stop_regex": pattern}})
    assert stopped.status_code == 200, stopped.text
    finish = stopped.json()["meta_info"]["finish_reason"]
    assert finish["type"] == "stop" and finish["matched"] == pattern, finish


def test_the_workers_queue_is_bounded_by_default(tiny_server: ServerProcess) -> None:
    status = requests.get(tiny_server.url + "/slo/status", timeout=30).json()
    assert status["engine"]["max_queued_requests"] == DEFAULT_MAX_QUEUED_REQUESTS
