"""A real worker's HTTP port with keys of every role (issue #45): the client key gets 401/403 on
every admin route SGLang serves and on ours, the admin and metrics keys reach theirs, /server_info
carries no key, no key shows in the process list, a non-ASCII agent token is a 400, a compressed
body is checked like any other, and the status socket lives in a private directory.

One worker for the session (keyed_worker.py): the tests only read, or call routes that change
nothing.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import orjson
import psutil
import pytest
import requests
import zstandard

from server.process import ServerProcess
from tests.integration.keyed_worker import KEYS
from tests.integration.worker_routes import CLIENT_PATHS, OPEN_PATHS

CLIENT_KEY = KEYS["api-key"]  # --api-key-file
ADMIN_KEY = KEYS["admin-api-key"]  # from the environment
METRICS_KEY = KEYS["prom"]  # from a key file named in the access file
TENANT_KEY = KEYS["open-tenant"]  # a client key the access file reads from the environment
# The list and more: every one must be refused to the client key, whatever SGLang marks.
NAMED_ADMIN = [
    ("POST", "/abort_request"), ("POST", "/pause_generation"), ("POST", "/continue_generation"),
    ("POST", "/update_weights_from_disk"), ("POST", "/load_lora_adapter"), ("POST", "/unload_lora_adapter"),
    ("POST", "/load_lora_adapter_from_tensors"), ("POST", "/configure_logging"), ("GET", "/flush_cache"),
    ("POST", "/flush_cache"), ("POST", "/start_profile"), ("POST", "/release_memory_occupation"),
    ("POST", "/set_internal_state"), ("POST", "/set_trace_level"), ("GET", "/slo/status"), ("GET", "/get_load"),
    ("POST", "/slo/migrate"), ("GET", "/metrics"),
]  # fmt: skip


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def worker(keyed_worker: ServerProcess) -> ServerProcess:
    """The session's worker with keys of every role (keyed_worker.py)."""
    return keyed_worker


def _served_routes(worker: ServerProcess) -> list[tuple[str, str]]:
    spec = requests.get(worker.url + "/openapi.json", headers=_auth(ADMIN_KEY), timeout=30)
    assert spec.status_code == 200, spec.text
    out = []
    for path, ops in spec.json()["paths"].items():
        out += [(method.upper(), path) for method in ops if path not in CLIENT_PATHS | OPEN_PATHS]
    return out


def test_the_client_key_is_refused_on_every_admin_route(worker: ServerProcess) -> None:
    routes = _served_routes(worker)
    assert len(routes) > 40 and ("POST", "/update_weights_from_disk") in routes  # SGLang's table, served
    refused = {}
    for method, path in sorted(set(routes) | set(NAMED_ADMIN)):
        url = worker.url + path.replace("{", "").replace("}", "")
        for key in (CLIENT_KEY, TENANT_KEY):
            resp = requests.request(method, url, json={}, headers=_auth(key), timeout=30)
            refused[(method, path, key[:6])] = resp.status_code
    allowed = {k: v for k, v in refused.items() if v not in (401, 403)}
    assert not allowed, allowed


def test_the_admin_key_reaches_admin_routes_and_the_metrics_key_only_metrics(worker: ServerProcess) -> None:
    for path in ("/slo/status", "/get_server_info", "/flush_cache"):  # SGLang 0.5.23 serves no /get_load
        resp = requests.get(worker.url + path, headers=_auth(ADMIN_KEY), timeout=30)
        assert resp.status_code == 200, (path, resp.text)
    metrics = requests.get(worker.url + "/metrics", headers=_auth(METRICS_KEY), timeout=30)
    assert metrics.status_code == 200 and "slo_" in metrics.text
    assert requests.get(worker.url + "/slo/status", headers=_auth(METRICS_KEY), timeout=30).status_code == 403
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
    assert requests.post(worker.url + "/generate", json=body, headers=_auth(METRICS_KEY), timeout=30).status_code == 403
    assert requests.post(worker.url + "/generate", json=body, timeout=30).status_code == 401
    for key in (CLIENT_KEY, TENANT_KEY):
        resp = requests.post(worker.url + "/generate", json=body, headers=_auth(key), timeout=120)
        assert resp.status_code == 200, resp.text
    assert requests.get(worker.url + "/health", timeout=30).status_code == 200


def test_server_info_carries_no_key(worker: ServerProcess) -> None:
    for key in (CLIENT_KEY, ADMIN_KEY):
        resp = requests.get(worker.url + "/server_info", headers=_auth(key), timeout=30)
        assert resp.status_code == 200, resp.text
        info = resp.json()
        assert "api_key" not in info and "admin_api_key" not in info and "model_path" in info
        for secret in (CLIENT_KEY, ADMIN_KEY, METRICS_KEY, TENANT_KEY):
            assert secret not in resp.text


def test_no_key_shows_in_the_process_list(worker: ServerProcess) -> None:
    assert worker.proc is not None
    root = psutil.Process(worker.proc.pid)
    for proc in [root, *root.children(recursive=True)]:
        line = " ".join(proc.cmdline())
        assert CLIENT_KEY not in line and ADMIN_KEY not in line, line


def test_a_non_ascii_agent_token_is_a_400_naming_the_header(worker: ServerProcess) -> None:
    body = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}
    headers = {**_auth(CLIENT_KEY), "x-slo-agent-token": "t\xe9t\xe9"}
    resp = requests.post(worker.url + "/generate", json=body, headers=headers, timeout=60)
    assert resp.status_code == 400, resp.text
    assert "x-slo-agent-token" in resp.text


def test_a_compressed_body_is_checked_like_any_other(worker: ServerProcess) -> None:
    headers = {**_auth(CLIENT_KEY), "x-body-compressed": "zstd", "content-type": "application/json"}

    def send(body: dict) -> requests.Response:
        data = zstandard.ZstdCompressor().compress(orjson.dumps(body))
        return requests.post(worker.url + "/generate", data=data, headers=headers, timeout=120)

    bad = send({"input_ids": [5, 6, 7], "slo": {"ttft_ms": -1}})
    assert bad.status_code == 400 and "slo.ttft_ms" in bad.text, bad.text
    # a client's own arrival stamp (an internal field) is dropped: its TTFT counts from its arrival here
    forged = {"slo_arrival": 1.0}
    good = send(
        {
            "input_ids": [5, 6, 7],
            "sampling_params": {"max_new_tokens": 2, "custom_params": forged},
            "slo": {"ttft_ms": 60_000},
        }
    )
    assert good.status_code == 200, good.text
    report = good.json()["meta_info"]["slo"]
    assert report["attained"]["ttft"] is True and report["ttft_ms"] < 60_000


def _status_socket_paths(worker: ServerProcess) -> list[str]:
    assert worker.proc is not None
    root = psutil.Process(worker.proc.pid)
    paths = []
    for proc in [root, *root.children(recursive=True)]:
        for conn in proc.net_connections(kind="unix"):
            for path in (conn.laddr, conn.raddr):
                if isinstance(path, str) and path.endswith(".ipc") and "status" in Path(path).name:
                    paths.append(path)
    return paths


def test_the_status_socket_is_in_a_private_directory(worker: ServerProcess) -> None:
    paths = _status_socket_paths(worker)
    assert paths, "no status socket found"
    for path in paths:
        directory = Path(path).parent
        mode = directory.stat().st_mode
        assert stat.S_IMODE(mode) & 0o077 == 0, (path, oct(mode))  # no one else may enter or create there
        assert directory.stat().st_uid == os.getuid()
        assert directory != Path(tempfile.gettempdir()), path
