"""Adversarial suite over the router's HTTP routes with every kind of caller (issue #45).

A real RouterService (dispatcher, ZMQ endpoint, registry, tokenizer) behind its ASGI app, its keys
from an access file (two client keys with SLO limits, a metrics key, an admin key), and one
scripted worker that records every Submit it is sent. The routes are read from the app itself, so
a route added later is covered without editing this file; a route this file does not know as a
client, metrics or health route is expected to be the operator's. Then hypothesis sends the
generation routes arbitrary JSON, odd SLO objects and headers, deep nesting and bad Authorization
headers: no answer is a 5xx, every refusal names its field, and nothing that reaches the worker
asks for more than the caller's key may.

The router runs on an event loop in a thread of its own for the whole module (hypothesis drives
examples synchronously; the worker's heartbeats must keep running between them).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import orjson
import pytest
import zmq.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from router.access import AccessTable
from router.protocol import Submit
from scheduler.core.slo import SloClass, parse_slo
from tests.unit.router._fake_worker import until
from tests.unit.router._router_harness import FakeWorkerHttp, Harness, ScriptedWorker, router
from wire import SHARE_PARAM, SLO_HEADER_FIELDS, TENANT_PARAM

T = TypeVar("T")
SLOW_HOST_S = 300.0  # only a hang guard: no test here bounds how fast anything is

ADMIN = "adversarial-admin-key-0123456789"
METRICS = "adversarial-metrics-key-012345678"
CLAMPED = "adversarial-client-a-key-01234567"  # limits, clamp
STRICT = "adversarial-client-b-key-01234567"  # limits, reject
WORKER_SECRET = b"adversarial-worker-secret-0123456789"
WORKER_KEYS = ("worker-own-api-key-0123456789", "worker-own-admin-key-0123456789")  # in its /server_info
ALL_SECRETS = (ADMIN, METRICS, CLAMPED, STRICT, WORKER_SECRET.decode(), *WORKER_KEYS)
ACCESS_FILE = """
keys:
  - {name: ops, role: admin, key_env: ADV_ADMIN}
  - {name: prom, role: metrics, key_env: ADV_METRICS}
  - name: tenant-a
    role: client
    key_env: ADV_CLAMPED
    share: 2
    limits: {classes: [latency, deadline, best_effort], min_ttft_ms: 1000, min_tpot_ms: 50,
             min_deadline_ms: 5000, max_weight: 2}
  - name: tenant-b
    role: client
    key_env: ADV_STRICT
    limits: {classes: [latency, best_effort], min_ttft_ms: 500, max_weight: 1, on_violation: reject}
"""


@dataclass(frozen=True)
class KeyTerms:
    """What this test expects of a client key (written here, not read from the code's table)."""

    name: str
    share: float
    classes: frozenset[SloClass]
    min_ttft_ms: float | None = None
    min_tpot_ms: float | None = None
    min_deadline_ms: float | None = None
    max_weight: float | None = None


TERMS = {
    CLAMPED: KeyTerms(
        "tenant-a",
        2.0,
        frozenset({SloClass.LATENCY, SloClass.DEADLINE, SloClass.BEST_EFFORT}),
        min_ttft_ms=1000,
        min_tpot_ms=50,
        min_deadline_ms=5000,
        max_weight=2,
    ),
    STRICT: KeyTerms("tenant-b", 1.0, frozenset({SloClass.LATENCY, SloClass.BEST_EFFORT}), 500, max_weight=1),
}

# The routes a client of the model may call, the scraper's and the probes' (independent of the
# code's table); every other route of the app must be the operator's.
CLIENT_PATHS = frozenset(
    {
        "/generate",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/model_info",
        "/get_model_info",
        "/server_info",
        "/get_server_info",
    }
)
METRICS_PATHS = frozenset({"/metrics"})
OPEN_PATHS = frozenset({"/health", "/health_generate"})
METHODS = ("GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS")
GENERATION = ("/generate", "/v1/completions", "/v1/chat/completions")
VALID_BODIES: dict[str, dict[str, Any]] = {
    "/generate": {"text": "hi", "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/slo/migrate": {"rid": "nobody", "to": "w0"},
}
# Who calls: name -> Authorization header value (None: none sent).
CALLERS: dict[str, bytes | None] = {
    "none": None,
    "wrong": b"Bearer not-a-key-of-this-router-at-all",
    "malformed": b"Basic " + ADMIN.encode(),  # the right secret in the wrong scheme
    "truncated": b"Bearer " + ADMIN[:-1].encode(),
    "client": b"Bearer " + CLAMPED.encode(),
    "metrics": b"Bearer " + METRICS.encode(),
    "admin": b"Bearer " + ADMIN.encode(),
}
UNAUTHENTICATED = ("none", "wrong", "malformed", "truncated")


class LeakyWorkerHttp(FakeWorkerHttp):
    """A worker whose settings hold its keys, as SGLang's /server_info does."""

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            self.calls.append((request.method, f"{request.url.host}/server_info"))
            settings_ = {"model_path": "tiny", "api_key": WORKER_KEYS[0], "admin_api_key": WORKER_KEYS[1]}
            return httpx.Response(
                200, json={**settings_, "internal_states": [{"worker_secret": WORKER_SECRET.decode()}]}
            )
        return super().handler(request)


class LoopThread:
    """An event loop running in its own thread; `call` runs a coroutine there and waits for it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="adversarial-router", daemon=True)
        self.thread.start()

    def call(self, coro: Awaitable[T], timeout_s: float = SLOW_HOST_S) -> T:
        async def bounded() -> T:
            return await asyncio.wait_for(coro, timeout_s)

        return asyncio.run_coroutine_threadsafe(bounded(), self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@dataclass
class Deployment:
    loop: LoopThread
    harness: Harness
    bare: httpx.AsyncClient  # no default headers
    worker_http: LeakyWorkerHttp

    @property
    def worker(self) -> ScriptedWorker:
        return self.harness.workers[0]

    def request(
        self, method: str, path: str, auth: bytes | None, content: bytes = b"", headers: dict[str, bytes] | None = None
    ) -> httpx.Response:
        sent = {name.encode(): value for name, value in (headers or {}).items()}
        if auth is not None:
            sent[b"authorization"] = auth
        return self.loop.call(self.bare.request(method, path, content=content, headers=sent))


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    config = Path(tmp_path_factory.mktemp("access")) / "access.yaml"
    config.write_text(ACCESS_FILE)
    env = {"ADV_ADMIN": ADMIN, "ADV_METRICS": METRICS, "ADV_CLAMPED": CLAMPED, "ADV_STRICT": STRICT}
    table = AccessTable.build(config_path=str(config), env=env)
    # A default SLO tighter than either key's limits: a request that sends none is held to them too.
    default = parse_slo({"class": "latency", "ttft_ms": 10, "tpot_ms": 1})
    loop = LoopThread()
    ctx = zmq.asyncio.Context()
    http = LeakyWorkerHttp()
    started = router(ctx, [], access=table, worker_secret=WORKER_SECRET, default_slo=default, admission_timeout_s=2.0)
    try:
        harness = loop.call(started.__aenter__())
        try:
            bare = loop.call(_client(harness.app))
            try:
                loop.call(_join_worker(harness, ctx, http))
                yield Deployment(loop, harness, bare, http)
            finally:
                loop.call(bare.aclose())
        finally:
            loop.call(started.__aexit__(None, None, None))  # stops the worker and the service
    finally:
        ctx.destroy(linger=0)
        loop.close()


async def _join_worker(harness: Harness, ctx: zmq.asyncio.Context, http: LeakyWorkerHttp) -> None:
    """One scripted worker that answers at once; on this shared host the loop can be held up for
    seconds, so the worker is dead only after a long silence (a 503 here would be the host's)."""
    harness.service.registry.dead_after_s = SLOW_HOST_S
    await harness.add_worker(ctx, "w0", delay_s=0.0, chunk=64, http=http, wait=False)
    await until(lambda: bool(harness.service.healthy()), SLOW_HOST_S)


async def _client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://router")


# --- the routes of the app, whatever they are ---


def app_routes(app: Any) -> list[tuple[str, frozenset[str]]]:
    """Every (path, methods) the ASGI app routes, found through its middleware (`.app`)."""
    for _ in range(16):
        routes = getattr(app, "routes", None)
        if routes is not None:
            return _flatten(routes, "")
        app = getattr(app, "app", None)
        if app is None:
            break
    raise AssertionError("no routing table found in the router's app")


def _flatten(routes: Any, prefix: str) -> list[tuple[str, frozenset[str]]]:
    out: list[tuple[str, frozenset[str]]] = []
    for route in routes:
        inner = getattr(route, "routes", None)
        if inner:  # a Mount
            out.extend(_flatten(inner, prefix + route.path))
        else:
            out.append((prefix + route.path, frozenset(getattr(route, "methods", None) or METHODS)))
    return out


def expected_role(path: str) -> str:
    if path in OPEN_PATHS:
        return "open"
    if path in METRICS_PATHS:
        return "metrics"
    return "client" if path in CLIENT_PATHS else "admin"


def may_call(caller: str, role: str) -> bool:
    if role == "open":
        return True
    if caller in UNAUTHENTICATED:
        return False
    return caller == "admin" or caller == role


def _error(resp: httpx.Response) -> dict[str, Any]:
    body = resp.json()
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), resp.text
    return body["error"]


def test_every_route_answers_each_caller_by_its_role(deployment: Deployment) -> None:
    """Every route x method x caller: refused callers get 401 (no or unknown key) or 403 (a key of
    another role) and nothing else; the operator's routes never run for a client or scraper;
    nobody gets a 5xx."""
    routes = app_routes(deployment.harness.app)
    paths = {path for path, _ in routes}
    assert CLIENT_PATHS | METRICS_PATHS | OPEN_PATHS <= paths, sorted(paths)
    admin_paths = {p for p in paths if expected_role(p) == "admin"}
    assert {"/slo/status", "/slo/migrate", "/flush_cache"} <= admin_paths
    flushes_before = _flushes(deployment)
    # refusals first, so any effect of a refused call on the workers is seen
    order = sorted(CALLERS, key=lambda c: c == "admin")
    checked = 0
    for caller in order:
        completed_before = _completed(deployment)
        for path, _ in routes:
            role = expected_role(path)
            for method in METHODS:
                body = orjson.dumps(VALID_BODIES.get(path, {})) if method in ("POST", "PUT", "PATCH") else b""
                resp = deployment.request(method, path, CALLERS[caller], body, {"content-type": b"application/json"})
                where = (caller, method, path, resp.status_code, resp.text[:300])
                assert resp.status_code < 500, where
                if may_call(caller, role):
                    assert resp.status_code not in (401, 403), where
                elif caller in UNAUTHENTICATED:
                    assert resp.status_code == 401, where
                    assert resp.headers.get("www-authenticate", "").lower().startswith("bearer"), where
                    assert method == "HEAD" or _error(resp)["type"] == "authentication_error", where
                else:
                    assert resp.status_code == 403, where
                    assert method == "HEAD" or _error(resp)["type"] == "permission_error", where
                checked += 1
            if caller != "admin":
                assert _flushes(deployment) == flushes_before, (caller, path)
        if caller != "admin" and caller != "client":
            assert _completed(deployment) == completed_before, caller  # only client keys generate
    assert checked == len(routes) * len(METHODS) * len(CALLERS)
    assert _flushes(deployment) > flushes_before  # the admin's flush did run: the 403s were real refusals


def _completed(deployment: Deployment) -> int:
    return int(deployment.harness.service.status()["dispatcher"]["completed"])


def _flushes(deployment: Deployment) -> int:
    return sum(path.endswith("/flush_cache") for _, path in deployment.worker_http.calls)


# Spellings of the operator's paths a guard keyed on the exact path could miss.
def _variants(path: str) -> list[str]:
    return [
        path + "/",
        path.upper(),
        "/" + path,
        path.replace("/", "//"),
        path + "?x=1",
        path + "%2F",
        path.replace("/s", "/%73", 1),
        path + "/.",
        path + ";x",
        "/./" + path.lstrip("/"),
        "/x/.." + path,
    ]


def test_spellings_of_the_operators_routes_reach_no_handler_for_a_client(deployment: Deployment) -> None:
    routes = app_routes(deployment.harness.app)
    admin_paths = sorted({p for p, _ in routes if expected_role(p) == "admin"} | METRICS_PATHS)
    flushes_before = _flushes(deployment)
    follow = httpx.AsyncClient(
        transport=httpx.ASGITransport(deployment.harness.app), base_url="http://router", follow_redirects=True
    )
    try:
        for path in admin_paths:
            for variant in _variants(path):
                for method in ("GET", "POST"):
                    for caller in ("none", "client"):
                        auth = CALLERS[caller]
                        headers = {b"authorization": auth} if auth else {}
                        resp = deployment.loop.call(follow.request(method, variant, headers=headers, content=b"{}"))
                        where = (caller, method, variant, resp.status_code, resp.text[:200])
                        assert resp.status_code in (401, 403, 404, 405), where
    finally:
        deployment.loop.call(follow.aclose())
    assert _flushes(deployment) == flushes_before


def test_server_info_carries_no_secret(deployment: Deployment) -> None:
    """Whoever reads /server_info (client or admin), no key of the router or the worker is in it."""
    for path, _ in app_routes(deployment.harness.app):
        if expected_role(path) not in ("client", "open", "metrics"):
            continue
        for caller in ("client", "admin"):
            resp = deployment.request("GET", path, CALLERS[caller])
            for secret in ALL_SECRETS:
                assert secret not in resp.text, (caller, path, secret)
    info = deployment.request("GET", "/server_info", CALLERS["client"])
    assert info.status_code == 200 and info.json()["model_path"] == "tiny", info.text


# --- hypothesis over the generation routes ---

JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),  # NaN and infinities too: the stdlib encoder writes them as bare words
    st.text(max_size=40),
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
NUMBERS = st.one_of(
    st.floats(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -0.0, 5e-324, 1e-300, 0.001, 1, 499.9, 500, 999.999, 1000, 4999, 1e15, 1e308]),
    st.text(max_size=6),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
CLASSES = st.sampled_from([c.value for c in SloClass] + ["LATENCY", "", "interactive", "best-effort"])
SLO_OBJECTS = st.fixed_dictionaries(
    {},
    optional={
        "class": CLASSES | JSON_SCALARS,
        "ttft_ms": NUMBERS,
        "tpot_ms": NUMBERS,
        "deadline_ms": NUMBERS,
        "max_queue_ms": NUMBERS,
        "weight": NUMBERS,
        "program_id": st.text(min_size=0, max_size=300) | JSON_SCALARS,
        "stage": st.integers(-3, 3) | st.text(max_size=5),
        "on_infeasible": st.sampled_from(["best_effort", "reject", "drop", ""]),
        "slo_tenant": st.just("tenant-b"),  # not an SLO field: must be refused, never trusted
    },
)
# Header values a real HTTP server can carry: visible ASCII, spaces and tabs, and any high byte.
HEADER_BYTES = st.binary(max_size=40).map(lambda b: bytes(c for c in b if c == 9 or 32 <= c != 127))
NON_ASCII = st.text(min_size=1, max_size=12).map(lambda s: ("é" + s).encode("utf-8"))
HEADER_VALUES = st.one_of(
    NUMBERS.map(lambda v: str(v).encode("utf-8", "replace")),
    HEADER_BYTES,
    NON_ASCII,
    st.sampled_from([b"nan", b"inf", b"-1", b"1e-9", b"0x10", b"1_000", "\uff11\uff10".encode()]),
)
SLO_HEADERS = st.dictionaries(
    st.sampled_from([*SLO_HEADER_FIELDS, "x-slo-agent-token", "x-slo-arrival", "x-slo-class"]),
    HEADER_VALUES,
    max_size=4,
)
PLACEMENTS = st.sampled_from(["body", "custom_params", "none"])
HYPOTHESIS = settings(
    max_examples=40,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)


def _with_slo(path: str, slo: dict[str, Any], placement: str) -> dict[str, Any]:
    body = json.loads(json.dumps(VALID_BODIES[path]))
    if placement == "body":
        body["slo"] = slo
    elif placement == "custom_params":
        holder = body.setdefault("sampling_params", {}) if path == "/generate" else body
        holder["custom_params"] = {"slo": slo, "slo_tenant": "tenant-b", "slo_share": 1000}
    return body


def _encode(body: Any) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


def check_answer(deployment: Deployment, resp: httpx.Response, key: str, submitted_from: int) -> None:
    """No 5xx but a shed or no-worker answer while the worker really is gone; a 4xx names its
    field; every Submit the request caused holds to the key's terms."""
    where = (resp.status_code, resp.text[:400])
    if resp.status_code >= 500:
        assert resp.status_code in (503, 504) and not deployment.harness.service.healthy(), where
    elif resp.status_code >= 400:
        error = _error(resp)
        assert isinstance(error.get("message"), str) and error["message"], where
        if resp.status_code not in (401, 429):
            assert isinstance(error.get("param"), str) and error["param"], where
    for submit in deployment.worker.submits[submitted_from:]:
        holds_to_terms(submit, TERMS[key])


def holds_to_terms(submit: Submit, terms: KeyTerms) -> None:
    spec = submit.slo or parse_slo({"class": "best_effort"})
    where = (terms.name, submit.slo)
    assert spec.slo_class in terms.classes, where
    for value, bound in (
        (spec.ttft_ms, terms.min_ttft_ms),
        (spec.tpot_ms, terms.min_tpot_ms),
        (spec.deadline_ms, terms.min_deadline_ms),
    ):
        assert value is None or bound is None or value >= bound, where
    assert terms.max_weight is None or spec.weight <= terms.max_weight, where
    assert spec.program_id is None or spec.program_id.startswith(f"{terms.name}/"), where
    custom = submit.sampling_params.get("custom_params") or {}
    assert custom.get(TENANT_PARAM) == terms.name and custom.get(SHARE_PARAM) == terms.share, (where, custom)


def _post(deployment: Deployment, path: str, key: str, content: bytes, headers: dict[str, bytes]) -> int:
    """POST as `key`, check the answer and what reached the worker; the status."""
    before = len(deployment.worker.submits)
    sent = {"content-type": b"application/json", **headers}
    resp = deployment.request("POST", path, b"Bearer " + key.encode(), content, sent)
    check_answer(deployment, resp, key, before)
    return resp.status_code


@HYPOTHESIS
@given(path=st.sampled_from(GENERATION), key=st.sampled_from(sorted(TERMS)), body=JSON_VALUES | st.binary(max_size=64))
def test_arbitrary_bodies_get_a_named_4xx_or_an_answer(deployment: Deployment, path: str, key: str, body: Any) -> None:
    content = body if isinstance(body, bytes) else _encode(body)
    _post(deployment, path, key, content, {})


@HYPOTHESIS
@given(
    path=st.sampled_from(GENERATION),
    key=st.sampled_from(sorted(TERMS)),
    slo=SLO_OBJECTS,
    placement=PLACEMENTS,
    headers=SLO_HEADERS,
    stream=st.booleans(),
)
def test_no_slo_reaches_a_worker_beyond_the_keys_limits(
    deployment: Deployment,
    path: str,
    key: str,
    slo: dict[str, Any],
    placement: str,
    headers: dict[str, bytes],
    stream: bool,
) -> None:
    body = _with_slo(path, slo, placement) | {"stream": stream}
    status = _post(deployment, path, key, _encode(body), headers)
    if placement == "none" and not set(headers) & set(SLO_HEADER_FIELDS):
        assert status == 200, "a request that asks for no SLO is never refused for its key's limits"


@pytest.mark.parametrize("key", sorted(TERMS), ids=lambda key: TERMS[key].name)
@pytest.mark.parametrize("path", GENERATION)
def test_the_servers_default_slo_is_clamped_to_the_key_never_refused(
    deployment: Deployment, path: str, key: str
) -> None:
    """The default SLO (tighter than both keys' limits here) is not the client's request: under
    either on_violation it is clamped to the key's limits, and the request is served."""
    before = len(deployment.worker.submits)
    status = _post(deployment, path, key, orjson.dumps(VALID_BODIES[path]), {})
    assert status == 200
    assert len(deployment.worker.submits) == before + 1


@pytest.mark.parametrize("depth", [64, 254, 255, 256, 300, 1000, 1024, 1025, 5000])
@pytest.mark.parametrize("where", ["custom_params", "top_level", "slo"])
def test_deep_nesting_is_a_4xx_or_an_answer(deployment: Deployment, depth: int, where: str) -> None:
    nested = "[" * depth + "]" * depth
    if where == "custom_params":
        raw = '{"text": "hi", "sampling_params": {"max_new_tokens": 2, "custom_params": {"x": ' + nested + "}}}"
    elif where == "top_level":
        raw = '{"text": "hi", "sampling_params": {"max_new_tokens": 2}, "extra": ' + nested + "}"
    else:
        raw = '{"text": "hi", "slo": {"program_id": ' + nested + "}}"
    _post(deployment, "/generate", CLAMPED, raw.encode(), {})


AUTH_PREFIXES = st.sampled_from(
    [b"Bearer ", b"bearer ", b"BEARER ", b"Basic ", b"Bearer\t", b"", b"Token ", b"Bearer  "]
)
KEY_MUTATIONS = st.sampled_from(
    [
        CLAMPED[:-1].encode(),
        (CLAMPED + "x").encode(),
        (CLAMPED + "é").encode(),
        CLAMPED.upper().encode(),
        b"",
        (CLAMPED[:5] + "\u00ff" + CLAMPED[6:]).encode("latin-1"),
    ]
)


@HYPOTHESIS
@given(auth=st.one_of(HEADER_BYTES, NON_ASCII, st.tuples(AUTH_PREFIXES, KEY_MUTATIONS | HEADER_BYTES).map(b"".join)))
def test_bad_authorization_headers_are_401_never_5xx(deployment: Deployment, auth: bytes) -> None:
    body = orjson.dumps(VALID_BODIES["/generate"])
    for path in ("/generate", "/slo/status"):
        before = len(deployment.worker.submits)
        resp = deployment.request("POST" if path == "/generate" else "GET", path, auth, body)
        assert resp.status_code == 401, (auth, path, resp.status_code, resp.text[:200])
        assert _error(resp)["type"] == "authentication_error"
        assert len(deployment.worker.submits) == before


def test_the_worker_stayed_healthy(deployment: Deployment) -> None:
    """Run last (file order): nothing above took the worker out; a plain request still works."""
    assert deployment.harness.service.healthy()
    resp = deployment.request("POST", "/generate", CALLERS["client"], orjson.dumps(VALID_BODIES["/generate"]))
    assert resp.status_code == 200, resp.text
    clamped = resp.json()["meta_info"]["slo"].get("clamped")
    assert clamped and clamped["ttft_ms"]["granted"] == 1000, resp.json()["meta_info"]["slo"]
