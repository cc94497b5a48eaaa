"""Admission on the real engine: a burst far above capacity gets an answer for every request
(2xx, or 429/503 with Retry-After and a reason), a request whose SLO cannot be met is answered
at once with a computed Retry-After, a stream shed before its first token gets the status too,
and PUT /generate cannot jump the queue with a forged arrival.

One server: the tiny model under EDF with one running slot and a queue of QUEUE_BOUND. Its perf
model is a fixed profile several times slower than the engine really is (as test_admission.py
explains), so what the admission check predicts is deterministic, and what it admits really has
the margin to make it. A "blocker" request holds the only slot while a queue builds (~3 s).
About 2 minutes.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from server.process import ServerProcess
from tests.integration.test_scheduling_order import _blocker
from wire import ARRIVAL_PARAM, SHED_REASONS

pytestmark = pytest.mark.paced  # asserts the engine's pace: runs alone (tests/conftest.py)

QUEUE_BOUND = 5
SLOW_PROFILE = {  # 20 ms per step + 2 ms per batch token: a 600-token prompt takes 1.2 s here
    "format": "sglang-slo-perf-profile/1",
    "roofline": {"terms": [{"b": 0.02, "k_tokens": 2e-3, "k_kv": 0.0, "k_spec": 0.0}]},
}
LONG_PROMPT = [5 + (i * 7) % 500 for i in range(600)]
SHORT_PROMPT = LONG_PROMPT[:20]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    profile = tmp_path_factory.mktemp("overload") / "slow-profile.json"
    profile.write_text(json.dumps(SLOW_PROFILE))
    with ServerProcess(
        "--model-path", "tiny", "--slo-policy", "edf", "--max-running-requests", "1",
        "--max-queued-requests", str(QUEUE_BOUND), "--slo-perf-profile", str(profile), name="overload",
    ) as srv:  # fmt: skip
        yield srv


def _generate(
    url: str, ids: list[int], slo: dict | None, n: int = 4, method: str = "POST", **extra: object
) -> requests.Response:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "ignore_eos": True}, **extra}
    if slo is not None:
        body["slo"] = slo
    return requests.request(method, url + "/generate", json=body, timeout=120)


def _assert_shed(resp: requests.Response, status: int, reason: str) -> dict:
    assert resp.status_code == status, resp.text
    error = resp.json()["error"]
    assert error["reason"] == reason and error["code"] == status
    wait = error["predicted_wait_ms"]
    retry = int(resp.headers["Retry-After"])
    assert retry >= 1 and error["retry_after_s"] == retry
    if wait is not None:
        assert retry == max(1, math.ceil(wait / 1000.0)), (retry, wait)  # computed, not a constant
    return error


def test_a_request_that_cannot_make_its_slo_is_rejected_at_once(server: ServerProcess) -> None:
    infeasible = {"ttft_ms": 500, "on_infeasible": "reject"}
    started = time.monotonic()
    alone = _assert_shed(_generate(server.url, LONG_PROMPT, infeasible), 503, "slo_infeasible")
    rejected_s = time.monotonic() - started
    assert alone["class"] == "latency"
    ok = _generate(server.url, SHORT_PROMPT, {"ttft_ms": 20_000, "on_infeasible": "reject"})
    assert ok.status_code == 200 and ok.json()["meta_info"]["slo"]["attained"]["overall"] is True
    started = time.monotonic()
    plain = _generate(server.url, LONG_PROMPT, {"ttft_ms": 500}, n=64)  # without reject: served, late
    assert plain.status_code == 200
    assert rejected_s < time.monotonic() - started  # at once: before any of the work serving takes
    blocker = _blocker(server)
    try:  # behind the blocker's remaining 800 decode steps the predicted wait is far longer
        behind = _assert_shed(_generate(server.url, LONG_PROMPT, infeasible), 503, "slo_infeasible")
        assert behind["predicted_wait_ms"] > (alone["predicted_wait_ms"] or 0) + 1000
    finally:
        blocker.join(timeout=300)


def test_a_burst_far_above_capacity_gets_an_answer_for_every_request(server: ServerProcess) -> None:
    blocker = _blocker(server)
    kinds = ["native", "stream", "chat", "native-slo"]

    def one(i: int) -> tuple[str, int, str | None]:
        kind = kinds[i % len(kinds)]
        if kind == "chat":
            body = {"messages": [{"role": "user", "content": f"burst {i}"}], "max_tokens": 4}
            resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
        elif kind == "stream":
            resp = _generate(server.url, SHORT_PROMPT, None, stream=True)
        else:
            resp = _generate(server.url, SHORT_PROMPT, {"ttft_ms": 60_000} if kind == "native-slo" else None)
        if resp.status_code == 200:  # a stream shed before its first token is a real 429 too
            if kind == "stream":
                assert resp.text.rstrip().endswith("data: [DONE]") and '"abort"' not in resp.text, resp.text[-300:]
            return kind, 200, None
        error = resp.json()["error"]
        assert error["reason"] in SHED_REASONS and int(resp.headers["Retry-After"]) >= 1, resp.text
        return kind, resp.status_code, error["reason"]

    try:
        with ThreadPoolExecutor(32) as pool:
            answers = list(pool.map(one, range(40)))  # every call returned: nothing hung
    finally:
        blocker.join(timeout=300)
    full = [a for a in answers if a[2] == "queue_full"]
    assert len(full) >= 40 - QUEUE_BOUND - 4 and all(status == 429 for _, status, _ in full)
    assert all(status in (200, 429) for _, status, _ in answers), answers
    assert requests.get(server.url + "/health", timeout=10).status_code == 200
    status = server.status_when(lambda s: s["engine"]["shed"].get("queue_full", 0) >= len(full))
    assert (
        status["engine"]["shed"]["queue_full"] >= len(full) and status["engine"]["max_queued_requests"] == QUEUE_BOUND
    )


def test_a_stream_shed_before_its_first_token_is_a_real_503(server: ServerProcess) -> None:
    """Nothing was streamed yet, so the client gets the status, not a 200 with an abort chunk."""
    blocker = _blocker(server)
    try:
        body = {
            "input_ids": SHORT_PROMPT,
            "sampling_params": {"max_new_tokens": 4},
            "stream": True,
            "slo": {"ttft_ms": 100_000, "max_queue_ms": 300},
        }
        resp = requests.post(server.url + "/generate", json=body, timeout=120)
        error = _assert_shed(resp, 503, "queue_timeout")
        assert "slo_queue_timeout" in error["message"]
    finally:
        blocker.join(timeout=300)


def test_openai_routes_shed_in_openai_shape_with_retry_after(server: ServerProcess) -> None:
    body = {
        "messages": [{"role": "user", "content": "word " * 600}],
        "max_tokens": 4,
        "slo": {"ttft_ms": 300, "on_infeasible": "reject"},
    }
    resp = requests.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    error = _assert_shed(resp, 503, "slo_infeasible")
    assert error["type"] == "service_unavailable" and "message" in error and "param" in error


def test_put_generate_with_a_forged_arrival_cannot_jump_the_queue(server: ServerProcess) -> None:
    """A queued behind the blocker first, then B by PUT claiming to have arrived an hour ago:
    were the forged arrival believed, EDF would serve B first (its deadline long past). With one
    running slot B's 256 tokens come after A's, ~0.4 s of decoding here that a client-side
    thread delay does not outlast (with 4 tokens a CI host once recorded B 0.7 ms before A)."""
    finished: dict[str, float] = {}
    slo = {"class": "deadline", "deadline_ms": 60_000}

    def send(name: str, method: str, custom: dict) -> None:
        params = {"max_new_tokens": 256, "ignore_eos": True, "custom_params": custom}
        resp = requests.request(
            method, server.url + "/generate", json={"input_ids": SHORT_PROMPT, "sampling_params": params, "slo": slo},
            timeout=120,
        )  # fmt: skip
        assert resp.status_code == 200, resp.text
        finished[name] = time.monotonic()

    blocker = _blocker(server)
    try:
        a = threading.Thread(target=send, args=("A", "POST", {}))
        a.start()
        time.sleep(0.3)
        b = threading.Thread(target=send, args=("B", "PUT", {ARRIVAL_PARAM: time.time() - 3600}))
        b.start()
        a.join(timeout=120)
        b.join(timeout=120)
    finally:
        blocker.join(timeout=300)
    assert finished["A"] < finished["B"], finished
