"""Poison containment on a real worker (tiny model, CPU, one shared server): a stop_regex that
would backtrack without end inside SGLang's scheduler loop is a 400 naming the field on the
native and OpenAI routes, the worker serves the next request as if nothing happened, a bounded
stop_regex still stops generation in SGLang, and the worker's queue is bounded by default."""

from __future__ import annotations

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
