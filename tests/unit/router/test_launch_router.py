"""launch_router's flags: defaults, validation with clean SystemExit messages, policy wiring
(slos gets SLOs-Serve's per-replica admission), RouteRequest fields, and the ASGI lifespan
starting the service."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import zmq.asyncio

import launch_router
from router.dispatcher import DEFAULT_MAX_QUEUED
from router.http_api import create_app
from router.policies import accepted_params
from router.policies.slos_routing import SlosRoutingPolicy
from router.prefix import prefix_hashes
from router.service import GenerateCall, RouterConfig, RouterService
from scheduler.core.slo import SloClass, SloSpec
from tests.unit.router._router_harness import run


def _config(*argv: str) -> RouterConfig:
    return launch_router.config_from_args(launch_router.build_parser().parse_args(list(argv)))


def test_defaults() -> None:
    cfg = _config()
    assert cfg.worker_bind == "tcp://127.0.0.1:30100" and cfg.routing_policy == "goodserve"
    assert cfg.dead_after_s == 2.0 and cfg.migrate_interval_s == 0.1 and cfg.api_key is None
    assert _config("--port", "8000").worker_bind == "tcp://127.0.0.1:8100"
    assert _config("--worker-port", "9999").worker_bind == "tcp://127.0.0.1:9999"
    assert _config("--migrate-interval-s", "0").migrate_interval_s is None
    assert _config("--worker-bind", "ipc:///tmp/r.sock").worker_bind == "ipc:///tmp/r.sock"


def test_the_pd_prefill_placement_is_spread_unless_asked_to_pack() -> None:
    assert _config().prefill_placement == "spread"
    assert _config("--pd-prefill-placement", "pack").prefill_placement == "pack"
    with pytest.raises(SystemExit):
        _config("--pd-prefill-placement", "busiest")


def test_policy_params_are_json_and_validated() -> None:
    cfg = _config("--routing-policy", "polyserve", "--routing-policy-param", "tiers_ms=[50, 100]",
                  "--routing-policy-param", "release_after_s=null")  # fmt: skip
    assert cfg.policy_params == {"tiers_ms": [50, 100], "release_after_s": None}
    assert _config("--routing-policy", "slos", "--routing-policy-param", "order=round_robin").policy_params == {
        "order": "round_robin"  # a bare word is a string
    }
    with pytest.raises(SystemExit, match="takes no parameter 'bogus'"):
        _config("--routing-policy-param", "bogus=1")
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        _config("--routing-policy-param", "tau")
    with pytest.raises(SystemExit, match="tau must be positive"):
        launch_router.build_service(_config("--routing-policy-param", "tau=0"))
    with pytest.raises(SystemExit, match="--routing-policy-param: .*tau must be int, got 1.5"):
        _config("--routing-policy-param", "tau=1.5")
    with pytest.raises(SystemExit, match="default_perf.base_s must be float"):
        _config("--routing-policy", "slos", "--routing-policy-param", 'default_perf={"base_s": "x"}')


def test_bad_flags_stop_with_a_message() -> None:
    with pytest.raises(SystemExit, match="not a loopback"):
        _config("--worker-bind", "tcp://10.0.0.1:5000")
    with pytest.raises(SystemExit, match="encrypted: give --curve-secret-key"):
        _config("--worker-bind", "tcp://10.0.0.1:5000", "--allow-remote-workers")
    with pytest.raises(SystemExit, match="--dead-after-s"):
        _config("--dead-after-s", "0")
    with pytest.raises(SystemExit, match="one of them"):
        _config("--worker-bind", "tcp://127.0.0.1:1", "--worker-port", "2")
    with pytest.raises(SystemExit, match="--length-predictor"):
        launch_router.build_service(_config("--length-predictor", "/nonexistent/predictor.pkl"))
    with pytest.raises(SystemExit):
        launch_router.build_parser().parse_args(["--routing-policy", "nope"])


def test_slos_gets_replica_admission_over_the_dispatchers_view() -> None:
    assert {"limit", "order", "default_output_tokens", "idle_batch_s"} <= set(accepted_params("slos"))
    assert "admit" not in accepted_params("slos")
    params = {"limit": 2, "idle_batch_s": 0.01, "default_perf": {"base_s": 0.01}}
    service = RouterService(RouterConfig(routing_policy="slos", policy_params=params))
    assert isinstance(service.policy, SlosRoutingPolicy) and service.policy.limit == 2
    admission = service.policy.admit
    assert admission.idle == 0.01 and admission.default_perf.base_s == 0.01
    assert admission.clock is service.clock


def test_the_lifespan_starts_and_stops_the_service(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        service = RouterService(RouterConfig(worker_bind="tcp://127.0.0.1:0"), ctx=ctx)
        started: list[str] = []
        app = create_app(service, on_started=lambda svc: started.append(svc.worker_address))
        messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
        sent: list[str] = []

        async def receive() -> dict[str, str]:
            return next(messages)

        async def send(message: dict[str, str]) -> None:
            sent.append(message["type"])
            if message["type"] == "lifespan.startup.complete":
                client = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://r")
                status = (await client.get("/slo/status")).json()
                assert status["worker_address"] == started[0] and status["workers"] == []
                assert (await client.get("/health")).status_code == 503
                await client.aclose()

        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
        assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
        assert started[0].startswith("tcp://127.0.0.1:")

    run(go)


class _Predictor:
    name = "stub"

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, str | None]] = []

    def predict(self, prompt_text: str, prompt_len: int, app_id: str | None = None) -> float:
        self.seen.append((prompt_text, prompt_len, app_id))
        return 41.2


def test_route_requests_carry_length_prefix_and_cap() -> None:
    predictor = _Predictor()
    service = RouterService(
        RouterConfig(routing_policy="goodserve", policy_params={"block_tokens": 4}), predictor=predictor
    )
    spec = SloSpec(deadline_ms=1000.0, slo_class=SloClass.DEADLINE, program_id="p1")
    call = GenerateCall("r1", list(range(10)), {"max_new_tokens": 20}, spec, True, 1.0, 2.0, prompt_text="hi")
    route = service.route_request(call)
    assert route.prompt_tokens == 10 and route.max_new_tokens == 20 and route.arrival_s == 2.0
    assert route.predicted_output_tokens == 20 and predictor.seen == [("hi", 10, "p1")]  # 42, capped by the client
    loose = replace(call, sampling_params={"max_new_tokens": 100})
    assert service.route_request(loose).predicted_output_tokens == 42
    assert route.prefix_hashes == prefix_hashes(list(range(10)), 4) and len(route.prefix_hashes) == 2
    assert service.status()["length_predictor"] == "stub"
    plain = RouterService(RouterConfig(routing_policy="round_robin", length_predictor="none")).route_request(call)
    assert plain.predicted_output_tokens is None and len(plain.prefix_hashes) == 0  # 64-token blocks


def test_the_history_predictor_learns_answer_lengths_from_completions() -> None:
    service = RouterService(RouterConfig(routing_policy="goodserve", length_predictor="history"))
    call = GenerateCall("r", [1, 2, 3], {"max_new_tokens": 500}, SloSpec(), True, 1.0, 2.0)
    assert service.status()["length_predictor"] == "history"
    for n in range(10, 29):
        service.observe_output(call, n)
    assert service.route_request(call).predicted_output_tokens is None  # 19 answers: still the client's cap
    service.observe_output(call, 29)
    assert service.route_request(call).predicted_output_tokens == 20  # the mean of 10..29, rounded up


def test_history_quantile_predictor_bounds_lengths_and_bad_specs_name_the_flag() -> None:
    service = RouterService(RouterConfig(routing_policy="goodserve", length_predictor="history:0.9"))
    call = GenerateCall("r", [1, 2, 3], {"max_new_tokens": 500}, SloSpec(), True, 1.0, 2.0)
    for n in range(1, 101):
        service.observe_output(call, n)
    assert 85 <= service.route_request(call).predicted_output_tokens <= 95  # the 90th percentile, not the mean
    with pytest.raises(SystemExit, match="^--length-predictor history:2"):
        launch_router.build_service(RouterConfig(routing_policy="goodserve", length_predictor="history:2"))


def test_overload_and_trust_flags(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("SGLANG_SLO_WORKER_SECRET", raising=False)
    cfg = _config()
    assert cfg.max_queued_requests == DEFAULT_MAX_QUEUED
    assert cfg.request_timeout_s == 600.0 and cfg.worker_secret is None
    assert cfg.stall_after_s == 30.0 and cfg.forget_after_s == 600.0
    cfg = _config("--max-queued-requests", "8", "--request-timeout-s", "0", "--stall-after-s", "5")
    assert cfg.max_queued_requests == 8 and cfg.request_timeout_s is None and cfg.stall_after_s == 5.0
    secret = tmp_path / "secret"
    secret.write_text("a worker secret from a file\n")
    assert _config("--worker-secret-file", str(secret)).worker_secret == b"a worker secret from a file"
    assert _config("--api-key", "k").worker_secret is not None  # the legacy stand-in, with a warning
    for argv, flag in (
        (["--worker-secret", "short"], "--worker-secret"),
        (["--max-queued-requests", "0"], "--max-queued-requests"),
        (["--request-timeout-s", "-1"], "--request-timeout-s"),
        (["--forget-after-s", "0"], "--forget-after-s"),
    ):
        with pytest.raises(SystemExit, match=flag):
            _config(*argv)


def test_remote_workers_need_the_routers_curve_keys(tmp_path: Path) -> None:
    import zmq.auth

    zmq.auth.create_certificates(str(tmp_path), "router")
    secret = str(tmp_path / "router.key_secret")
    cfg = _config(
        "--worker-bind", "tcp://10.0.0.1:5000", "--allow-remote-workers", "--curve-secret-key", secret,
        "--worker-secret", "a worker secret of its own",
    )  # fmt: skip
    assert cfg.allow_remote_workers and cfg.curve_secret_key == secret
    assert _config("--curve-secret-key", secret).curve_secret_key == secret  # loopback may encrypt too
    with pytest.raises(SystemExit, match="--curve-secret-key: .*no secret key"):
        _config("--curve-secret-key", str(tmp_path / "router.key"))


def test_a_tokenizer_path_must_exist_on_the_routers_machine(tmp_path: Path) -> None:
    assert _config("--tokenizer-path", str(tmp_path)).tokenizer_path == str(tmp_path)
    with pytest.raises(SystemExit, match="--tokenizer-path: no such"):
        _config("--tokenizer-path", str(tmp_path / "nope"))


def test_a_workers_model_path_missing_here_asks_for_tokenizer_path() -> None:
    import asyncio

    from router.tokenizer import RouterTokenizer, TokenizerUnavailable

    tokenizer = RouterTokenizer()  # the default loader, on a worker's path that is not here
    with pytest.raises(
        TokenizerUnavailable, match="not on the router's machine: start the router with --tokenizer-path"
    ):
        asyncio.run(tokenizer.ensure("/models/on/the/worker/llama"))
    assert "--tokenizer-path" in (tokenizer.error or "")


@pytest.fixture
def _no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SGLANG_SLO_WORKER_SECRET", "SGLANG_SLO_API_KEY", "SGLANG_SLO_ADMIN_API_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.usefixtures("_no_key_env")
def test_remote_workers_need_a_worker_secret_of_their_own(tmp_path: Path) -> None:
    import zmq.auth

    zmq.auth.create_certificates(str(tmp_path), "router")
    remote = ["--worker-bind", "tcp://10.0.0.1:5000", "--allow-remote-workers",
              "--curve-secret-key", str(tmp_path / "router.key_secret")]  # fmt: skip
    for extra in ([], ["--api-key", "the client key, 16+ bytes"]):  # the client key is no stand-in off loopback
        with pytest.raises(SystemExit, match="^--worker-secret: remote workers"):
            _config(*remote, *extra)
    with pytest.raises(SystemExit, match="^--worker-secret: remote workers"):
        _config("--allow-remote-workers", "--api-key", "k")  # allowed is enough, even on a loopback bind
    assert (
        _config(*remote, "--worker-secret", "a worker secret of its own").worker_secret == b"a worker secret of its own"
    )
    assert _config("--api-key", "k").worker_secret is not None  # loopback: the legacy stand-in, with a warning


@pytest.mark.usefixtures("_no_key_env")
def test_the_worker_secret_is_no_http_key(tmp_path: Path) -> None:
    key = "one key for everything, 16+ bytes"
    with pytest.raises(SystemExit, match="^--worker-secret: must differ from every HTTP key"):
        _config("--api-key", key, "--worker-secret", key)
    admin = tmp_path / "admin"
    admin.write_text(key + "\n")
    with pytest.raises(SystemExit, match="^--worker-secret: must differ from every HTTP key"):
        _config("--admin-api-key-file", str(admin), "--worker-secret", key)


@pytest.mark.usefixtures("_no_key_env")
def test_keys_come_from_files_or_the_environment_with_their_roles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from router.access import Role

    client, admin = tmp_path / "client", tmp_path / "admin"
    client.write_text("client key from a file\n")
    admin.write_text("admin key from a file, 16+ bytes\n")
    cfg = _config("--api-key-file", str(client), "--admin-api-key-file", str(admin))
    assert cfg.access.authenticate("Bearer client key from a file").role is Role.CLIENT
    assert cfg.access.authenticate("Bearer admin key from a file, 16+ bytes").role is Role.ADMIN
    assert cfg.api_key == "client key from a file"
    monkeypatch.setenv("SGLANG_SLO_API_KEY", "client key from the env")
    monkeypatch.setenv("SGLANG_SLO_ADMIN_API_KEY", "admin key from the env, 16+ bytes")
    cfg = _config()
    assert cfg.access.authenticate("Bearer client key from the env").role is Role.CLIENT
    assert cfg.access.authenticate("Bearer admin key from the env, 16+ bytes").role is Role.ADMIN
    assert _config("--api-key", "the flag wins").access.authenticate("Bearer client key from the env") is None
    monkeypatch.delenv("SGLANG_SLO_API_KEY")
    monkeypatch.delenv("SGLANG_SLO_ADMIN_API_KEY")
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for argv, message in (
        (["--api-key", "k", "--api-key-file", str(client)], "^--api-key and --api-key-file: give one"),
        (["--api-key-file", str(empty)], "^--api-key-file: .* is empty"),
        (["--admin-api-key-file", str(tmp_path / "nope")], "^--admin-api-key-file: "),
        (["--admin-api-key", "short"], "^--admin-api-key: must be at least 16 bytes"),
        (["--api-key-file", str(admin), "--admin-api-key-file", str(admin)], "^--admin-api-key: .*same key"),
    ):
        with pytest.raises(SystemExit, match=message):
            _config(*argv)


@pytest.mark.usefixtures("_no_key_env")
def test_the_auth_config_gives_roles_and_the_worker_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from router.access import Role

    monkeypatch.setenv("TEST_WORKER_KEY", "the worker key of the file")
    monkeypatch.setenv("TEST_SCRAPER_KEY", "the scraper key of the file")
    conf = tmp_path / "auth.yaml"
    conf.write_text(
        "keys:\n"
        "  - {name: scraper, role: metrics, key_env: TEST_SCRAPER_KEY}\n"
        "  - {name: workers, role: worker, key_env: TEST_WORKER_KEY}\n"
    )
    cfg = _config("--auth-config", str(conf), "--api-key", "a client key")
    assert cfg.worker_secret == b"the worker key of the file"
    assert cfg.access.authenticate("Bearer the scraper key of the file").role is Role.METRICS
    assert cfg.access.authenticate("Bearer the worker key of the file") is None  # never an HTTP key
    assert cfg.access.authenticate("Bearer a client key").role is Role.CLIENT
    with pytest.raises(SystemExit, match="^--worker-secret: differs from the worker key of --auth-config"):
        _config("--auth-config", str(conf), "--worker-secret", "another worker secret")
    assert _config("--auth-config", str(conf), "--worker-secret", "the worker key of the file").worker_secret
    conf.write_text("keys:\n  - {name: x, role: root, key_env: TEST_WORKER_KEY}\n")
    with pytest.raises(SystemExit, match=f"^--auth-config {conf}: keys\\[0\\].role: must be one of"):
        _config("--auth-config", str(conf))
