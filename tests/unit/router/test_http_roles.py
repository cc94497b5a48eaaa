"""Who may call which router route, over the real app, dispatcher and ZMQ endpoint: a client key
never reaches the operator's routes or /metrics, an admin key reaches every route, a metrics key
only /metrics, an unknown key nothing but the health checks; /flush_cache is POST only; a
worker's settings reach a client without any credential, and a client learns no request ids or
worker addresses from /server_info."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import orjson
import zmq.asyncio

from router.access import PRINCIPAL_SCOPE_KEY, AccessTable, Principal, Role
from router.http_api import create_app
from router.http_guard import ROUTE_ROLES, RoleGuard, is_secret_name, scrub_secrets
from router.service import RouterConfig, RouterService
from router.worker_auth import legacy_secret
from tests.unit.router._fake_worker import until
from tests.unit.router._router_harness import FakeWorkerHttp, router, run

CLIENT = "tenant-a-client-key-0123456789"
ADMIN = "operator-admin-key-0123456789"
METRICS = "prometheus-scrape-key-0123456"
WORKER_SECRET = b"the workers' own secret, not an HTTP key"
ADMIN_ROUTES = (("GET", "/slo/status"), ("POST", "/slo/migrate"), ("POST", "/flush_cache"))
CLIENT_ROUTES = (
    ("POST", "/generate"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/model_info"),
    ("GET", "/get_model_info"),
    ("GET", "/server_info"),
    ("GET", "/get_server_info"),
)
BODIES: dict[str, Any] = {
    "/generate": {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}},
    "/v1/completions": {"model": "m", "prompt": "a", "max_tokens": 2},
    "/v1/chat/completions": {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/slo/migrate": {"rid": "none-such", "to": "w0"},
}


def _table() -> AccessTable:
    return AccessTable(
        [
            (CLIENT, Principal("tenant-a", Role.CLIENT)),
            (ADMIN, Principal("ops", Role.ADMIN)),
            (METRICS, Principal("prometheus", Role.METRICS)),
        ],
        worker_secret=WORKER_SECRET.decode(),
    )


async def _call(client: httpx.AsyncClient, method: str, path: str, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if method == "POST":
        return await client.post(path, json=BODIES.get(path, {}), headers=headers)
    return await client.get(path, headers=headers)


def test_a_client_key_is_no_operator_key(ctx: zmq.asyncio.Context) -> None:
    """--api-key alone: a client key; the operator's routes and /metrics are not its."""

    async def go() -> None:
        async with router(ctx, [{}], api_key=CLIENT, worker_secret=WORKER_SECRET) as h:
            for method, path in (*ADMIN_ROUTES, ("GET", "/metrics")):
                resp = await _call(h.client, method, path, CLIENT)
                assert resp.status_code == 403, (path, resp.text)
                error = resp.json()["error"]
                needed = "metrics" if path == "/metrics" else "admin"
                assert error["type"] == "permission_error" and f"the {needed} role" in error["message"], error
            assert not any(path.endswith("/flush_cache") for _, path in h.http.calls)
            assert h.service.status()["dispatcher"]["completed"] == 0
            for method, path in CLIENT_ROUTES:
                assert (await _call(h.client, method, path, CLIENT)).status_code == 200, path

    run(go)


def test_each_key_reaches_only_the_routes_of_its_role(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}], api_key=CLIENT, access=_table(), worker_secret=WORKER_SECRET) as h:
            bare = httpx.AsyncClient(transport=httpx.ASGITransport(h.app), base_url="http://router")
            for method, path in (*CLIENT_ROUTES, *ADMIN_ROUTES, ("GET", "/metrics")):
                for key in (None, "not-a-key-of-this-router", CLIENT[:-1]):
                    resp = await _call(bare, method, path, key)
                    assert resp.status_code == 401, (path, key, resp.text)
                    assert resp.json()["error"]["type"] == "authentication_error"
                    assert resp.headers["www-authenticate"] == "Bearer"
                assert (await _call(bare, method, path, CLIENT)).status_code == (
                    200 if (method, path) in CLIENT_ROUTES else 403
                ), path
            for method, path in CLIENT_ROUTES:
                assert (await _call(bare, method, path, ADMIN)).status_code == 200, path  # admin may do all
                assert (await _call(bare, method, path, METRICS)).status_code == 403, path
            assert (await _call(bare, "GET", "/metrics", METRICS)).status_code == 200
            assert (await _call(bare, "GET", "/metrics", ADMIN)).status_code == 200
            for method, path in ADMIN_ROUTES:
                assert (await _call(bare, method, path, METRICS)).status_code == 403, path
            assert (await _call(bare, "GET", "/slo/status", ADMIN)).json()["workers"][0]["worker_id"] == "w0"
            assert (await _call(bare, "POST", "/flush_cache", ADMIN)).status_code == 200
            missing = await _call(bare, "POST", "/slo/migrate", ADMIN)  # past the guard: the route's own 404
            assert missing.status_code == 404 and missing.json()["error"]["param"] == "rid"
            for path in ("/health", "/health_generate"):
                assert (await bare.get(path)).status_code == 200
            assert (await _call(bare, "GET", "/no/such/route", None)).status_code == 401
            assert (await _call(bare, "GET", "/no/such/route", CLIENT)).status_code == 404
            await bare.aclose()
            impostor = await h.add_worker(ctx, "w9", secret=legacy_secret(CLIENT), wait=False)
            await until(lambda: bool(impostor.acks))
            assert impostor.acks[0].accepted is False and "w9" not in h.service.registry.worker_ids()

    run(go)


def test_flush_cache_is_post_only(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        async with router(ctx, [{}]) as h:
            assert (await h.client.get("/flush_cache")).status_code == 405
            assert not any(path.endswith("/flush_cache") for _, path in h.http.calls)
            assert (await h.client.post("/flush_cache")).status_code == 200

    run(go)


class _LeakyWorkerHttp(FakeWorkerHttp):
    """A worker whose settings hold its keys, as SGLang's /server_info does."""

    SECRETS = ("client-key-of-the-worker", "admin-key-of-the-worker", "nested-secret", "a-token-value", "pw")

    def handler(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/server_info":
            self.calls.append((request.method, f"{request.url.host}/server_info"))
            return httpx.Response(
                200,
                json={
                    "model_path": "tiny",
                    "api_key": "client-key-of-the-worker",
                    "admin_api_key": "admin-key-of-the-worker",
                    "ssl_keyfile_password": "pw",
                    "max_total_num_tokens": 4096,
                    "tokenizer_path": "tiny-tok",
                    "internal_states": [{"slo": {"Worker_Secret": "nested-secret", "agent_token": "a-token-value"}}],
                },
            )
        if request.url.path == "/model_info":
            return httpx.Response(200, json={"model_path": "tiny", "extra": {"apiKey": "client-key-of-the-worker"}})
        return super().handler(request)


def test_server_info_carries_no_secret_and_no_request_or_worker_address(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        leaky = _LeakyWorkerHttp()
        workers = [{"http": leaky, "chunk": 1, "delay_s": 0.05}]
        async with router(ctx, workers, api_key=CLIENT, worker_secret=WORKER_SECRET) as h:
            task = asyncio.ensure_future(h.client.post("/generate", json={"input_ids": [1], "rid": "someone-elses"}))
            await until(lambda: h.service.registry.worker_of("someone-elses") is not None)
            for path in ("/server_info", "/get_server_info", "/model_info"):
                resp = await h.client.get(path)
                assert resp.status_code == 200, resp.text
                for secret in _LeakyWorkerHttp.SECRETS:
                    assert f'"{secret}"' not in resp.text, (path, secret)
            info = (await h.client.get("/server_info")).json()
            assert info["max_total_num_tokens"] == 4096 and info["tokenizer_path"] == "tiny-tok"
            assert info["internal_states"] == [{"slo": {}}]
            assert "someone-elses" not in orjson.dumps(info).decode()  # no one's request ids
            assert h.service.worker_address not in orjson.dumps(info).decode()
            assert info["router"]["workers"] == ["w0"] and info["router"]["policy"] == "round_robin"
            assert (await task).status_code == 200

    run(go)


def test_secret_names_are_found_at_any_depth() -> None:
    settings = {
        "api_key": "a",
        "admin_api_key": "b",
        "hf_token": "c",
        "max_prefill_tokens": 8,
        "bucket_time_to_first_token": [0.1],
        "skip_tokenizer_init": False,
        "list": [{"nested": {"client_secret": "d", "ssl_keyfile": "/k", "Credentials": {"x": 1}, "keep": "e"}}],
    }
    assert scrub_secrets(settings) == {
        "max_prefill_tokens": 8,
        "bucket_time_to_first_token": [0.1],
        "skip_tokenizer_init": False,
        "list": [{"nested": {"keep": "e"}}],
    }
    assert is_secret_name("SGLANG_SLO_WORKER_SECRET", None) and not is_secret_name("tokenizer_path", "p")


def test_the_guard_leaves_the_caller_in_the_scope() -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get(PRINCIPAL_SCOPE_KEY))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def go() -> None:
        client = httpx.AsyncClient(transport=httpx.ASGITransport(RoleGuard(app, _table())), base_url="http://r")
        await client.post("/generate", headers={"Authorization": f"Bearer {CLIENT}"})
        await client.get("/metrics", headers={"Authorization": f"bearer {METRICS}"})
        await client.get("/health")
        assert [p.name if p else None for p in seen] == ["tenant-a", "prometheus", None]
        for raw in (b"Bearer \xff\xfe", b"Basic " + CLIENT.encode(), b"Bearer", CLIENT.encode()):
            resp = await client.get("/v1/models", headers=[(b"authorization", raw)])
            assert resp.status_code == 401, raw  # never a 500, never a pass
        open_client = httpx.AsyncClient(
            transport=httpx.ASGITransport(RoleGuard(app, AccessTable())), base_url="http://r"
        )
        assert (await open_client.get("/slo/status")).status_code == 204  # no key configured: open, as before
        assert seen[-1].role is Role.ADMIN
        await client.aclose()
        await open_client.aclose()

    run(go)


def test_every_route_of_the_app_has_a_role() -> None:
    app = create_app(RouterService(RouterConfig(routing_policy="round_robin", length_predictor="none")), lifespan=False)
    assert isinstance(app, RoleGuard)
    assert {route.path for route in app.app.routes} == set(ROUTE_ROLES)
