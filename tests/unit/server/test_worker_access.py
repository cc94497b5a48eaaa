"""The worker's HTTP edge as its key check (SloMiddleware with WorkerAccess) in front of a small
fake inner app: each route's role, 401/403 before anything of SGLang runs, the internal key in
place of the caller's, the Principal in the scope, /server_info without keys, the agent token
header, compressed bodies opened and checked, and the launcher's key flags."""

from __future__ import annotations

import argparse

import orjson
import pytest
import zstandard

from router.access import PRINCIPAL_SCOPE_KEY, AccessTable, Principal, Role
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server.slo_middleware import SloMiddleware
from server.worker_access import (
    ADMIN_API_KEY_ENV,
    INTERNAL,
    WorkerAccess,
    access_for,
    build_worker_access,
    guard_keys,
    resolve_key_flags,
    route_role,
    scrub_secrets,
)
from tests.unit.server.middleware_harness import DEFAULT, FakeApp, Response, call
from wire import AGENT_TOKEN_HEADER, SLO_PARAM

CLIENT, ADMIN, METRICS = "client-key-0123456789", "admin-key-0123456789", "metrics-key-0123456789"
# SGLang's routes that change or expose the server, as its http_server.py serves them
ADMIN_ROUTES = [
    ("POST", "/abort_request"),
    ("POST", "/pause_generation"),
    ("POST", "/continue_generation"),
    ("POST", "/update_weights_from_disk"),
    ("POST", "/update_weights_from_tensor"),
    ("POST", "/load_lora_adapter"),
    ("POST", "/load_lora_adapter_from_tensors"),  # not marked admin by SGLang
    ("POST", "/unload_lora_adapter"),
    ("POST", "/configure_logging"),
    ("GET", "/flush_cache"),
    ("POST", "/flush_cache"),
    ("POST", "/start_profile"),
    ("POST", "/release_memory_occupation"),
    ("POST", "/set_internal_state"),
    ("POST", "/set_trace_level"),  # not marked admin by SGLang
    ("GET", "/get_load"),
    ("GET", "/slo/status"),
    ("POST", "/slo/anything"),
    ("GET", "/openapi.json"),
]


def _table() -> AccessTable:
    return AccessTable(
        [
            (CLIENT, Principal("tenant", Role.CLIENT)),
            (ADMIN, Principal("ops", Role.ADMIN)),
            (METRICS, Principal("prom", Role.METRICS)),
        ]
    )


def make_middleware(access: WorkerAccess | None, inner: FakeApp | None = None, **kw) -> tuple[SloMiddleware, FakeApp]:
    inner = inner or FakeApp()
    mw = SloMiddleware(
        inner, SloReportBook(SloMetrics()), DEFAULT, lambda: {"policy": "edf"}, access=access, agent_token="tok", **kw
    )
    return mw, inner


def _bearer(key: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {key}".encode())]


@pytest.mark.parametrize("method, path", ADMIN_ROUTES)
def test_the_client_key_is_refused_on_every_admin_route_before_sglang(method, path):
    mw, inner = make_middleware(WorkerAccess(_table(), "internal-key"))
    resp = Response(call(mw, method, path, b"{}", headers=_bearer(CLIENT)))
    assert resp.status == 403 and "admin" in resp.json()["error"]["message"]
    assert resp.json()["error"]["param"] == "authorization"
    assert inner.calls == []
    assert Response(call(mw, method, path, b"{}", headers=_bearer("wrong"))).status == 401
    assert Response(call(mw, method, path, b"{}")).status == 401
    assert inner.calls == []


def test_the_admin_key_passes_with_the_internal_key_in_its_place_and_the_principal_in_the_scope():
    mw, inner = make_middleware(WorkerAccess(_table(), "internal-key"))
    assert Response(call(mw, "POST", "/pause_generation", b"{}", headers=_bearer(ADMIN))).status == 200
    scope = inner.calls[0]["scope"]
    assert dict(scope["headers"])[b"authorization"] == b"Bearer internal-key"
    assert scope[PRINCIPAL_SCOPE_KEY].name == "ops"
    assert not any(ADMIN.encode() in v for _, v in scope["headers"])


def test_roles_client_generates_metrics_scrapes_health_is_open():
    mw, inner = make_middleware(WorkerAccess(_table(), "internal-key"))
    gen = orjson.dumps({"text": "x"})
    assert Response(call(mw, "POST", "/generate", gen, headers=_bearer(CLIENT))).status == 200
    assert inner.calls[-1]["scope"][PRINCIPAL_SCOPE_KEY].name == "tenant"
    assert Response(call(mw, "POST", "/generate", gen, headers=_bearer(METRICS))).status == 403
    assert Response(call(mw, "GET", "/metrics", headers=_bearer(CLIENT))).status == 403
    assert Response(call(mw, "GET", "/metrics", headers=_bearer(METRICS))).status == 200
    assert Response(call(mw, "GET", "/health")).status == 200
    assert Response(call(mw, "OPTIONS", "/generate")).status == 200  # CORS preflight carries no key
    assert Response(call(mw, "GET", "/v1/models/tiny", headers=_bearer(CLIENT))).status == 200


def test_the_internal_key_is_admin_and_is_never_a_callers_key_in_the_table():
    access = WorkerAccess(_table(), "internal-key")
    assert access.check("POST", "/abort_request", b"Bearer internal-key").principal is INTERNAL
    assert access.check("POST", "/abort_request", b"Bearer internal-keyX").status == 401


def test_a_websocket_needs_a_key_too():
    mw, inner = make_middleware(WorkerAccess(_table(), "internal-key"))
    sent = call(mw, "GET", "/v1/realtime", scope_type="websocket")
    assert sent == [{"type": "websocket.close", "code": 1008}] and inner.calls == []
    call(mw, "GET", "/v1/realtime", headers=_bearer(CLIENT), scope_type="websocket")
    assert len(inner.calls) == 1


def test_api_key_alone_off_loopback_locks_admin_routes_naming_the_admin_flag():
    access = build_worker_access(CLIENT, None, None, "0.0.0.0")
    refused = access.check("POST", "/update_weights_from_disk", f"Bearer {CLIENT}".encode())
    assert refused.status == 403 and "--admin-api-key" in refused.message
    assert access.check("POST", "/generate", f"Bearer {CLIENT}".encode()).allowed
    # on loopback the only key keeps SGLang's meaning
    assert (
        build_worker_access(CLIENT, None, None, "127.0.0.1")
        .check("GET", "/slo/status", f"Bearer {CLIENT}".encode())
        .allowed
    )


def test_no_key_at_all_stays_open_without_an_internal_key():
    access = build_worker_access(None, None, None, "127.0.0.1")
    assert access.is_open and access.internal_key is None and access.inner_authorization() is None
    assert access.check("POST", "/abort_request", None).allowed


def test_route_roles():
    assert route_role("POST", "/generate") is Role.CLIENT
    assert route_role("GET", "/generate") is Role.ADMIN  # only the methods SGLang serves for clients
    assert route_role("GET", "/flush_cache") is Role.ADMIN
    assert route_role("GET", "/metrics") is Role.METRICS
    assert route_role("GET", "/health_generate") is None


def test_server_info_leaves_without_any_key():
    info = {"api_key": CLIENT, "admin_api_key": ADMIN, "ssl_keyfile_password": "pw", "model_path": "m"}
    inner = FakeApp(chunks=(orjson.dumps({**info, "internal_states": [{"api_key": "x"}]}),))
    mw, _ = make_middleware(WorkerAccess(_table(), "internal-key"), inner)
    resp = Response(call(mw, "GET", "/server_info", headers=_bearer(CLIENT)))
    assert resp.status == 200 and resp.json() == {"model_path": "m", "internal_states": [{}]}
    assert scrub_secrets([{"admin_api_key": 1}]) == [{}]


def test_a_non_ascii_agent_token_is_a_400_naming_the_header():
    mw, inner = make_middleware(None)
    body = orjson.dumps({"text": "x"})
    resp = Response(call(mw, "POST", "/generate", body, headers=[(AGENT_TOKEN_HEADER.encode(), "tökén".encode())]))
    assert resp.status == 400 and resp.json()["error"]["param"] == AGENT_TOKEN_HEADER
    assert inner.calls == []


def _zstd(obj) -> bytes:
    return zstandard.ZstdCompressor().compress(orjson.dumps(obj))


def test_a_compressed_body_is_opened_and_checked_before_sglang():
    mw, inner = make_middleware(None, decompression=True)
    body = {"text": "x", "sampling_params": {"custom_params": {"slo_arrival": 1.0}}, "slo": {"ttft_ms": 5000}}
    resp = Response(call(mw, "POST", "/generate", _zstd(body), headers=[(b"x-body-compressed", b"zstd")]))
    assert resp.status == 200
    seen = inner.calls[0]
    assert b"x-body-compressed" not in dict(seen["scope"]["headers"])
    custom = orjson.loads(seen["body"])["sampling_params"]["custom_params"]
    assert custom["slo_arrival"] != 1.0 and custom[SLO_PARAM]["ttft_ms"] == 5000  # stripped, then stamped here
    bad = {"text": "x", "slo": {"ttft_ms": -1}}
    resp = Response(call(mw, "POST", "/generate", _zstd(bad), headers=[(b"x-body-compressed", b"zstd")]))
    assert resp.status == 400 and resp.json()["error"]["param"] == "slo.ttft_ms"


def test_a_compressed_body_that_cannot_be_opened_is_a_4xx(monkeypatch):
    mw, inner = make_middleware(None, decompression=True)
    resp = Response(call(mw, "POST", "/generate", b"garbage", headers=[(b"x-body-compressed", b"zstd")]))
    assert resp.status == 400 and resp.json()["error"]["param"] == "x-body-compressed"
    resp = Response(call(mw, "POST", "/generate", b"x", headers=[(b"x-body-compressed", b"br")]))
    assert resp.status == 400
    monkeypatch.setattr("server.slo_middleware.MAX_BODY_BYTES", 1000)
    bomb = zstandard.ZstdCompressor().compress(b" " * 10_000)
    resp = Response(call(mw, "POST", "/generate", bomb, headers=[(b"x-body-compressed", b"zstd")]))
    assert resp.status == 413 and inner.calls == []


def _args(**kw) -> argparse.Namespace:
    base = {"api_key": None, "api_key_file": None, "admin_api_key": None, "admin_api_key_file": None}
    return argparse.Namespace(**{**base, **kw})


def test_keys_come_from_files_or_the_environment_not_the_command_line(tmp_path, monkeypatch):
    key_file = tmp_path / "k"
    key_file.write_text(CLIENT + "\n")
    monkeypatch.setenv(ADMIN_API_KEY_ENV, ADMIN)
    args = _args(api_key_file=str(key_file))
    resolve_key_flags(args)
    assert (args.api_key, args.admin_api_key) == (CLIENT, ADMIN)
    with pytest.raises(SystemExit, match="--api-key-file"):
        resolve_key_flags(_args(api_key_file=str(tmp_path / "missing")))
    with pytest.raises(SystemExit, match="give one"):
        resolve_key_flags(_args(api_key="x", api_key_file=str(key_file)))


def test_settings_that_would_bypass_the_key_check_stop_start_up():
    base = {"api_key": CLIENT, "admin_api_key": ADMIN, "auth_config": None, "router_address": None, "host": "0.0.0.0"}
    with pytest.raises(SystemExit, match="--grpc-port"):
        access_for(argparse.Namespace(**base, grpc_port=30001, tokenizer_worker_num=1))
    with pytest.raises(SystemExit, match="--tokenizer-worker-num"):
        access_for(argparse.Namespace(**base, grpc_port=None, tokenizer_worker_num=2))


def test_sglang_gets_only_the_internal_key():
    args = argparse.Namespace(api_key=CLIENT, admin_api_key=None, auth_config=None, host="0.0.0.0")
    access = access_for(args)
    guard_keys(args, access)
    assert args.api_key == args.admin_api_key == access.internal_key and CLIENT not in args.api_key
