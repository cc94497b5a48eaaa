"""Adversarial suite over a real worker's HTTP port with every kind of caller (issue #45).

The session's real tiny-model worker with keys of every role (keyed_worker.py): among them an
admin key, a metrics key, two client keys with SLO limits ("tenant-a", "tenant-b") and the
worker-link key, and a default SLO tighter than either client key may ask for. Its own OpenAPI
schema (SGLang's routes, fetched with the admin key) drives schemathesis:
every operation that is not a client route answers a client key 403 and a missing or unknown key
401, whatever body, path or query schemathesis makes up; no info route carries a key; and
schemathesis's bodies on /generate with a client key never get a 5xx, nor an SLO beyond the key's.

The client routes are written here (generation, tokenization, sessions, model and server info),
not read from the code's table: an operation SGLang adds later is expected to be the operator's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from server.process import ServerProcess
from tests.integration.keyed_worker import KEYS
from tests.integration.worker_routes import CLIENT_PATHS, OPEN_PATHS

HTTP_TIMEOUT_S = 300.0  # a hang guard only: nothing here bounds how fast the worker answers
INFO_PATHS = ("/server_info", "/get_server_info", "/model_info", "/get_model_info", "/v1/models")
# Routes of our edge or of FastAPI that are not in SGLang's schema: all the operator's.
EXTRA_ADMIN = (
    ("GET", "/openapi.json"),
    ("GET", "/docs"),
    ("GET", "/redoc"),
    ("GET", "/slo/status"),
    ("POST", "/slo/migrate"),
    ("GET", "/flush_cache"),
    ("DELETE", "/generate"),
    ("GET", "/generate"),
)
SECRET_FIELDS = ("api_key", "admin_api_key")
# What the access file grants each client key (the test's own copy, to check answers against).
LIMITS: dict[str, dict[str, Any]] = {
    "tenant-a": {"classes": {"latency", "deadline", "best_effort"}, "ttft_ms": 1000, "tpot_ms": 50,
                 "deadline_ms": 5000, "weight": 2},
    "tenant-b": {"classes": {"latency", "best_effort"}, "ttft_ms": 500, "weight": 1},
}  # fmt: skip
# Derandomized: every run draws the same examples, so a red CI run names a change of the code,
# not a new draw (each draw costs a real request to a real worker; explore with more examples
# and another seed by hand, and add what breaks as an @example or a guard test).
SCHEMATHESIS = settings(
    database=None,
    derandomize=True,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@dataclass
class Worker:
    server: ServerProcess
    keys: dict[str, str]  # every key's name (keyed_worker.py) -> its secret
    schema: Any  # schemathesis's view of the worker's /openapi.json
    openapi: dict[str, Any]

    @property
    def url(self) -> str:
        return self.server.url

    def auth(self, name: str | None) -> dict[str, str]:
        if name is None:
            return {}
        secret = self.keys.get(name, "an-unknown-key-of-plenty-of-bytes")
        return {"Authorization": f"Bearer {secret}"}


@pytest.fixture(scope="module")
def worker(keyed_worker: ServerProcess) -> Worker:
    """The session's worker with keys of every role (keyed_worker.py) and its schema."""
    resp = requests.get(
        keyed_worker.url + "/openapi.json", headers={"Authorization": f"Bearer {KEYS['ops']}"}, timeout=HTTP_TIMEOUT_S
    )
    assert resp.status_code == 200, resp.text
    openapi = resp.json()
    return Worker(keyed_worker, dict(KEYS), schemathesis.openapi.from_dict(openapi), openapi)


def operations(worker: Worker) -> list[Any]:
    return [result.ok() for result in worker.schema.get_all_operations()]


def refusals(
    worker: Worker, op: Any, callers: tuple[tuple[str | None, int], ...], examples: int, wrong: list[Any]
) -> Any:
    """A hypothesis test sending `examples` schemathesis cases of `op` as each caller, noting in
    `wrong` every answer that is not the caller's expected status."""

    @settings(SCHEMATHESIS, max_examples=examples)
    @given(case=op.as_strategy())
    def refused(case: Any) -> None:
        for caller, status in callers:
            resp = case.call(base_url=worker.url, headers=worker.auth(caller), timeout=HTTP_TIMEOUT_S)
            if resp.status_code != status:
                wrong.append((op.label, caller, resp.status_code, resp.text[:200]))

    return refused


def test_the_schema_is_sglangs_full_table(worker: Worker) -> None:
    """The routes below are the ones the worker serves, admin ones included (not an empty schema)."""
    labels = {(op.method.upper(), op.path) for op in operations(worker)}
    for route in (("POST", "/update_weights_from_disk"), ("POST", "/configure_logging"), ("POST", "/abort_request")):
        assert route in labels, sorted(labels)
    assert len({path for _, path in labels} - CLIENT_PATHS - OPEN_PATHS) > 30


def test_no_client_or_scraper_key_reaches_an_admin_operation(worker: Worker) -> None:
    """Every operation outside the client routes, with bodies, paths and queries schemathesis
    makes up: each client key 403, the metrics key 403, no key or an unknown key 401."""
    wrong: list[tuple[Any, ...]] = []
    checked: set[tuple[str, str]] = set()
    for op in operations(worker):
        if op.path in CLIENT_PATHS or op.path in OPEN_PATHS:
            continue
        checked.add((op.method.upper(), op.path))
        admin_callers = (("tenant-a", 403), ("tenant-b", 403), ("prom", 403), (None, 401), ("unknown", 401))
        refusals(worker, op, admin_callers, 3, wrong)()
    for method, path in EXTRA_ADMIN:
        for caller, status in (("tenant-a", 403), ("prom", 403), (None, 401)):
            resp = requests.request(method, worker.url + path, headers=worker.auth(caller), timeout=HTTP_TIMEOUT_S)
            if resp.status_code != status:
                wrong.append((f"{method} {path}", caller, resp.status_code, resp.text[:200]))
    assert len(checked) > 30
    assert not wrong, wrong
    alive = requests.get(worker.url + "/health", timeout=HTTP_TIMEOUT_S)
    assert alive.status_code == 200  # nothing the refused calls carried reached SGLang


def test_the_client_routes_need_a_client_key(worker: Worker) -> None:
    """The client operations: 401 without a key, 403 for the scraper's key; and the client key
    does get through (model info, a generation), so the refusals above are the guard's."""
    wrong: list[tuple[Any, ...]] = []
    for op in operations(worker):
        if op.path in CLIENT_PATHS:
            refusals(worker, op, (("prom", 403), (None, 401), ("unknown", 401)), 1, wrong)()
    assert not wrong, wrong
    for key in ("tenant-a", "tenant-b", "ops"):
        info = requests.get(worker.url + "/model_info", headers=worker.auth(key), timeout=HTTP_TIMEOUT_S)
        assert info.status_code == 200, (key, info.text)
        body: dict[str, Any] = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
        gen = requests.post(worker.url + "/generate", json=body, headers=worker.auth(key), timeout=HTTP_TIMEOUT_S)
        assert gen.status_code == 200, (key, gen.text)


def _fields(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k), v
            yield from _fields(v)
    elif isinstance(value, list):
        for v in value:
            yield from _fields(v)


def test_no_info_route_carries_a_key(worker: Worker) -> None:
    """Whoever reads them (client or admin), the info routes hold none of the worker's keys, and
    no api_key / admin_api_key field at all (SGLang's would hold the worker's internal key)."""
    for path in INFO_PATHS:
        for caller in ("tenant-a", "tenant-b", "ops"):
            resp = requests.get(worker.url + path, headers=worker.auth(caller), timeout=HTTP_TIMEOUT_S)
            assert resp.status_code == 200, (path, caller, resp.text)
            for name, secret in worker.keys.items():
                assert secret not in resp.text, (path, caller, name)
            leaked = [(k, v) for k, v in _fields(resp.json()) if k.lower() in SECRET_FIELDS and v]
            assert not leaked, (path, caller, leaked)


SLO_VALUES = st.one_of(
    st.sampled_from([0.001, 1, 10, 499, 500, 999, 1000, 4999, 5000, 60_000, 1e300]),
    st.floats(min_value=1e-6, max_value=1e6),
    st.integers(-5, 5),
    st.text(max_size=4),
    st.none(),
)
SLO_OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "class": st.sampled_from(["latency", "deadline", "compound", "best_effort", "x"]),
        "ttft_ms": SLO_VALUES,
        "tpot_ms": SLO_VALUES,
        "deadline_ms": SLO_VALUES,
        "weight": SLO_VALUES,
        "program_id": st.sampled_from(["p", "tenant-b/p", "x" * 300]),
    },
)


def _within_limits(report: dict[str, Any], tenant: str) -> None:
    spec, limits = report["spec"], LIMITS[tenant]
    assert spec["class"] in limits["classes"], (tenant, spec)
    for name in ("ttft_ms", "tpot_ms", "deadline_ms"):
        if spec.get(name) is not None and name in limits:
            assert spec[name] >= limits[name], (tenant, spec)
    assert spec.get("weight", 1.0) <= limits["weight"], (tenant, spec)


def _check_generation(status: int, text: str, tenant: str) -> None:
    where = (status, text[:400])
    assert status < 500, where
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if status >= 400:
        error = body.get("error", body) if isinstance(body, dict) else None
        assert isinstance(error, dict) and (error.get("message") or error.get("detail")), where
        return
    for item in body if isinstance(body, list) else [body]:
        if isinstance(item, dict) and isinstance(item.get("meta_info"), dict) and "slo" in item["meta_info"]:
            _within_limits(item["meta_info"]["slo"], tenant)


def _tiny(body: Any) -> Any:
    """A generated body with every sampling_params capped to two new tokens (the tiny model on a
    CPU: the pass checks answers, not generation) and a prompt when it has none."""
    if not isinstance(body, dict):
        return body
    params = body.get("sampling_params")
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict):
            p["max_new_tokens"] = 2
    if params is None:
        body["sampling_params"] = {"max_new_tokens": 2}
    if not any(body.get(k) is not None for k in ("text", "input_ids", "input_embeds")):
        body["text"] = "hi"  # past SGLang's first check, to the fields behind it
    return body


@settings(SCHEMATHESIS, max_examples=20)
@given(data=st.data(), tenant=st.sampled_from(sorted(LIMITS)))
def test_generated_generate_bodies_never_get_a_5xx(worker: Worker, data: st.DataObject, tenant: str) -> None:
    """schemathesis's GenerateReqInput bodies with a client key: a 4xx with a message or an
    answer, never a 5xx, and the SLO served is within the key's limits."""
    case = data.draw(worker.schema["/generate"]["POST"].as_strategy())
    case.body = _tiny(case.body)
    resp = case.call(base_url=worker.url, headers=worker.auth(tenant), timeout=HTTP_TIMEOUT_S)
    _check_generation(resp.status_code, resp.text, tenant)


@settings(SCHEMATHESIS, max_examples=15)
@given(tenant=st.sampled_from(sorted(LIMITS)), slo=st.one_of(st.none(), SLO_OBJECTS))
def test_no_slo_is_served_beyond_the_keys_limits(worker: Worker, tenant: str, slo: dict[str, Any] | None) -> None:
    """The worker's own edge holds each key to its limits, as the router does."""
    body: dict[str, Any] = {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    if slo is not None:
        body["slo"] = slo
    resp = requests.post(worker.url + "/generate", json=body, headers=worker.auth(tenant), timeout=HTTP_TIMEOUT_S)
    _check_generation(resp.status_code, resp.text, tenant)
    if slo is None:  # the default SLO (tighter than either key's) is clamped, never refused
        assert resp.status_code == 200, resp.text
        assert resp.json()["meta_info"]["slo"]["clamped"]["ttft_ms"]["granted"] == LIMITS[tenant]["ttft_ms"]
    if resp.status_code == 403:
        assert resp.json()["error"]["param"].startswith("slo."), resp.text


# SGLang's sampling parameters, what the router hands on to a worker as the client sent them.
SAMPLING_KEYS = (
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "no_stop_trim",
    "spaces_between_special_tokens", "logit_bias", "sampling_seed", "n", "unknown_knob",
)  # fmt: skip
ODD_VALUES = st.one_of(
    st.integers(-(2**40), 2**40),
    st.sampled_from([0, -1, 1, 511, 512, 2**63, -0.0, 1e308]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=4),
    st.booleans(),
    st.none(),
    st.lists(st.integers(-3, 600), max_size=3),
    st.dictionaries(st.sampled_from(["0", "5", "511", "512", "-1", "x"]), st.floats(-5, 5) | st.text(max_size=2)),
)  # fmt: skip


@settings(SCHEMATHESIS, max_examples=25)
@given(params=st.dictionaries(st.sampled_from(SAMPLING_KEYS), ODD_VALUES, max_size=3))
@example(params={"logit_bias": {"5": "x"}})
@example(params={"logit_bias": {"5": None}})
def test_odd_sampling_params_get_a_4xx_and_leave_the_worker_serving(worker: Worker, params: dict[str, Any]) -> None:
    """Each sampling parameter with values of the wrong type or range, as a client key sends
    them (the router forwards sampling_params as they are): a 4xx with a message or an answer,
    and the worker still serves everyone else afterwards."""
    body: dict[str, Any] = {"text": "hi", "sampling_params": {**params, "max_new_tokens": 2}}
    resp = requests.post(worker.url + "/generate", json=body, headers=worker.auth("tenant-a"), timeout=HTTP_TIMEOUT_S)
    _check_generation(resp.status_code, resp.text, "tenant-a")
    assert _serving(worker), ("the worker stopped serving after", body)


@pytest.mark.parametrize(
    "extra",
    [
        {"return_hidden_states": []},
        {"return_hidden_states": "all"},
        {"return_logprob": "x"},
        {"lora_id": ["x"]},
        {"extra_key": ["a"]},
    ],
    ids=["hidden_states_list", "hidden_states_str", "logprob_str", "lora_id_list", "extra_key_list"],
)
def test_odd_request_fields_leave_the_worker_serving(worker: Worker, extra: dict[str, Any]) -> None:
    """Fields of SGLang's GenerateReqInput with a value of the wrong type, straight to the
    worker's port with a client key: a 4xx, and the worker still serves."""
    body: dict[str, Any] = {"text": "hi", "sampling_params": {"max_new_tokens": 2}, **extra}
    resp = requests.post(worker.url + "/generate", json=body, headers=worker.auth("tenant-a"), timeout=HTTP_TIMEOUT_S)
    _check_generation(resp.status_code, resp.text, "tenant-a")
    assert _serving(worker), ("the worker stopped serving after", body)


def _serving(worker: Worker) -> bool:
    """Whether the worker still generates (a dead scheduler takes the whole server down)."""
    try:
        body: dict[str, Any] = {"text": "ok", "sampling_params": {"max_new_tokens": 1}}
        resp = requests.post(worker.url + "/generate", json=body, headers=worker.auth("ops"), timeout=HTTP_TIMEOUT_S)
    except requests.ConnectionError:
        return False
    return resp.status_code == 200
