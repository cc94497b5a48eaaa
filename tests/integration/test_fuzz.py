"""Fuzzing every route of the real server (SGLang's and ours) with hypothesis: whatever a client
sends, the answer is never a 5xx and never a hang. Bounded for CI: EXAMPLES bodies per route
family and one pass over the read-only GET routes SGLang's OpenAPI document lists (about 2 min
on the shared tiny-model server)."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.process import ServerProcess

EXAMPLES = 30
TIMEOUT_S = 60.0  # a request still unanswered by then counts as a hang
# Routes whose job is to change or stop the server (weights, memory, profiling, shutdown): a fuzz
# call would do exactly that, and the suite shares this server.
STATEFUL = (
    "shutdown", "weights", "memory", "profile", "pause", "continue", "abort", "expert", "lora",
    "session", "flush", "configure", "set_", "update", "release", "resume", "freeze", "slow_down", "dump",
    "internal_state", "load", "unload", "start", "stop", "clear", "reset", "destroy", "init",
)  # fmt: skip

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(allow_nan=False), st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
slos = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "ttft_ms": scalars,
            "tpot_ms": scalars,
            "deadline_ms": scalars,
            "class": st.sampled_from(["latency", "deadline", "compound", "best_effort", "x"]),
            "program_id": st.one_of(st.text(max_size=300), scalars),
            "stage": scalars,
            "weight": scalars,
            "max_queue_ms": scalars,
            "on_infeasible": st.sampled_from(["reject", "best_effort", "maybe"]),
        },
    ),
)
sampling = st.fixed_dictionaries(
    {"max_new_tokens": st.integers(0, 8)},
    optional={
        "temperature": scalars,
        "top_p": scalars,
        "stop": json_values,
        "custom_params": st.dictionaries(
            st.sampled_from(["slo", "slo_arrival", "slo_oracle_output_len", "x"]), json_values
        ),
        "n": st.integers(-1, 3),
        "ignore_eos": scalars,
    },
)
prompts = st.one_of(st.text(max_size=200), st.lists(st.integers(-5, 2**33), max_size=30), json_values)
native = st.fixed_dictionaries(
    {},
    optional={
        "text": prompts,
        "input_ids": prompts,
        "sampling_params": st.one_of(sampling, json_values),
        "slo": slos,
        "stream": scalars,
        "rid": scalars,
        "return_logprob": scalars,
        "junk": json_values,
    },
)
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "x"]), "content": json_values}),
    max_size=3,
)
openai = st.fixed_dictionaries(
    {"max_tokens": st.integers(0, 8)},
    optional={
        "model": scalars,
        "prompt": prompts,
        "messages": messages,
        "stream": scalars,
        "slo": slos,
        "custom_params": json_values,
        "stream_options": json_values,
        "chat_template_kwargs": json_values,
        "response_format": json_values,
        "n": st.integers(-1, 3),
    },
)
vertex = st.fixed_dictionaries(
    {},
    optional={
        "instances": st.lists(st.fixed_dictionaries({}, optional={"text": prompts}), max_size=2),
        "parameters": native,
    },
)
headers = st.dictionaries(
    st.sampled_from(["x-slo-ttft-ms", "x-slo-tpot-ms", "x-slo-deadline-ms", "x-slo-arrival"]), st.text(max_size=10)
)
ROUTES = [
    ("POST", "/generate", native),
    ("PUT", "/generate", native),
    ("POST", "/v1/completions", openai),
    ("POST", "/v1/chat/completions", openai),
    ("POST", "/invocations", openai),
    ("POST", "/vertex_generate", vertex),
]


def _ascii(values: dict[str, str]) -> dict[str, str]:
    return {k: v.encode("ascii", "replace").decode() for k, v in values.items()}


@pytest.mark.parametrize(("method", "path", "bodies"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES])
def test_no_body_gets_a_5xx_or_hangs(tiny_server: ServerProcess, method: str, path: str, bodies: Any) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(body=bodies, extra=headers)
    def check(body: Any, extra: dict[str, str]) -> None:
        resp = requests.request(method, tiny_server.url + path, json=body, headers=_ascii(extra), timeout=TIMEOUT_S)
        assert resp.status_code < 500, (method, path, body, resp.status_code, resp.text[:500])

    check()
    assert requests.get(tiny_server.url + "/health", timeout=10).status_code == 200


def test_every_read_only_route_answers_without_a_5xx(tiny_server: ServerProcess) -> None:
    spec = requests.get(tiny_server.url + "/openapi.json", timeout=10).json()
    paths = [
        p for p, ops in spec["paths"].items()
        if "get" in ops and "{" not in p and not any(word in p for word in STATEFUL)
    ]  # fmt: skip
    assert "/health" in paths and len(paths) > 5
    failures = {}
    for path in [*paths, "/slo/status", "/metrics"]:
        resp = requests.get(tiny_server.url + path, timeout=TIMEOUT_S)
        if resp.status_code >= 500:
            failures[path] = (resp.status_code, resp.text[:200])
    assert not failures, failures
