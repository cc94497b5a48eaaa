"""launch_server on GPUs, across machines and with parallelism: the CPU hook refused on a GPU,
per-rank CPU thread binding for tensor and data parallelism, the PD prefill chunk resolved at 2B before
SGLang sizes memory, encrypted links to a remote router, and the addresses a worker advertises."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq.auth

import launch_argv
import launch_checks
import launch_server
from launch_argv import cpu_threads_binding, kv_host_ip
from launch_server import resolve_server_args

# ---- tensor parallelism on CPU ---------------------------------------------------------------------


def test_each_tp_rank_gets_its_own_cores_past_the_numa_nodes() -> None:
    assert cpu_threads_binding(2, [0, 1], numa_nodes=1) == "0|1"  # this 2-core machine
    assert cpu_threads_binding(2, [0, 1, 2, 3], numa_nodes=1) == "0-1|2-3"
    assert cpu_threads_binding(4, list(range(8)), numa_nodes=2) == "0-1|2-3|4-5|6-7"
    assert cpu_threads_binding(2, [0, 1, 2, 3], numa_nodes=2) is None  # SGLang's one node per rank
    assert cpu_threads_binding(1, [0, 1], numa_nodes=1) is None
    assert cpu_threads_binding(3, [0, 1], numa_nodes=1) is None  # too few cores: SGLang says so


def test_the_binding_is_set_for_tp_on_cpu_unless_the_user_set_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(launch_argv, "_numa_nodes", lambda: 1)
    launch_argv._with_cpu_defaults(["--tp-size", "2"])
    assert os.environ["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"
    monkeypatch.setenv("SGLANG_CPU_OMP_THREADS_BIND", "1|0")
    launch_argv._with_cpu_defaults(["--tp-size", "2"])
    assert os.environ["SGLANG_CPU_OMP_THREADS_BIND"] == "1|0"


def test_every_scheduler_rank_counts_data_parallel_replicas_too(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launch_argv.scheduler_ranks([]) == 1
    assert launch_argv.scheduler_ranks(["--dp-size", "2"]) == 2  # SGLang binds each replica's rank
    assert launch_argv.scheduler_ranks(["--tp-size=2", "--data-parallel-size", "2", "--pp-size", "2"]) == 8
    monkeypatch.delenv("SGLANG_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(launch_argv, "_numa_nodes", lambda: 1)
    launch_argv._with_cpu_defaults(["--dp-size", "2"])
    assert os.environ["SGLANG_CPU_OMP_THREADS_BIND"] == "0|1"


# ---- PD prefill: the start-up chunk is resolved by SGLang at 2B ------------------------------------


class _Records:
    """SGLang's from_cli_args and resolution: records stay unresolved (None chunk) until resolved,
    where a None chunk becomes `default`, divided among `attn_dp` attention-DP ranks."""

    def __init__(self, default: int = 4096, mode: str = "prefill", attn_dp: int = 1) -> None:
        self.default, self.mode, self.attn_dp = default, mode, attn_dp
        self.built: list[int | None] = []

    def __call__(self, args: Any) -> Any:
        self.built.append(args.chunked_prefill_size)
        return SimpleNamespace(disaggregation_mode=self.mode, chunked_prefill_size=args.chunked_prefill_size)

    def resolved(self, record: Any, *names: str) -> tuple[Any, ...]:
        chunk = (record.chunked_prefill_size or self.default) // self.attn_dp
        return tuple({"chunked_prefill_size": chunk, "attn_dp_size": self.attn_dp}[n] for n in names)


def test_a_prefill_worker_is_declared_at_twice_its_chunk() -> None:
    records = _Records(default=4096)
    server_args = resolve_server_args(
        SimpleNamespace(chunked_prefill_size=None, slo_policy="slos"), records, records.resolved
    )
    assert records.built[-1] == 8192 and server_args.chunked_prefill_size == 8192  # SGLang's default, doubled
    records = _Records()
    assert resolve_server_args(
        SimpleNamespace(chunked_prefill_size=1024, slo_policy="tempo"), records, records.resolved
    )
    assert records.built[-1] == 2048


def test_attention_dp_doubles_the_declared_chunk() -> None:
    records = _Records(attn_dp=2)
    server_args = resolve_server_args(
        SimpleNamespace(chunked_prefill_size=2048, slo_policy="slos"), records, records.resolved
    )
    assert server_args.chunked_prefill_size == 4096  # 2 x 1024 per rank


@pytest.mark.parametrize(("mode", "policy"), [("prefill", "fcfs"), ("null", "slos"), ("decode", "slos")])
def test_other_workers_keep_their_arguments(mode: str, policy: str) -> None:
    records = _Records(mode=mode)
    assert resolve_server_args(SimpleNamespace(chunked_prefill_size=1024, slo_policy=policy), records, records.resolved)
    assert records.built == [1024]


def test_sglang_resolves_a_prefill_worker_at_twice_its_default_chunk() -> None:
    """Against the installed SGLang: its records come unresolved (no chunk before resolution),
    so the sizing must ask its resolution, not the record."""
    from sglang.srt.server_args import ServerArgs

    from launch_server import build_parser, resolved_fields
    from server.models import ensure_tiny_model

    argv = ["--model-path", str(ensure_tiny_model()), "--device", "cpu", "--disaggregation-mode", "prefill"]
    args = build_parser().parse_args([*argv, "--slo-policy", "slos"])
    (default,) = resolved_fields(ServerArgs.from_cli_args(args), "chunked_prefill_size")
    assert default > 0
    server_args = resolve_server_args(args, ServerArgs.from_cli_args)
    assert resolved_fields(server_args, "chunked_prefill_size") == (2 * default,)


# ---- a GPU machine ---------------------------------------------------------------------------------


def test_a_gpu_server_refuses_a_venv_with_the_cpu_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from server.cpu_support import venv_hook

    monkeypatch.setattr(venv_hook, "_target", lambda site_packages: tmp_path / venv_hook.PTH_NAME)
    hook = venv_hook.install_pth()
    with pytest.raises(SystemExit, match="CPU import hook .*run ./slo setup"):
        launch_checks._refuse_cpu_hook_on_gpu()
    assert venv_hook.remove_pth() == hook and not hook.exists()  # what ./slo setup does on a GPU machine
    assert venv_hook.remove_pth() is None and venv_hook.installed_pth() is None
    launch_checks._refuse_cpu_hook_on_gpu()


def test_an_emulated_card_on_a_gpu_serves_the_gpu_sized_tiny_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from server import models
    from server.emulation import resolve, startup_flags

    flags = startup_flags(resolve("h100"), lambda *f: False, "tiny-gpu")
    assert flags[flags.index("--model-path") + 1] == "tiny-gpu"
    monkeypatch.setenv("SGLANG_SLO_CACHE", str(tmp_path))
    config = json.loads((models.ensure_tiny_gpu_model() / "config.json").read_text())
    assert config["hidden_size"] // config["num_attention_heads"] == 64  # FlashInfer/FA3 head sizes
    assert config.get("torch_dtype", config.get("dtype")) == "bfloat16"


# ---- across machines -------------------------------------------------------------------------------


def _parse(*argv: str) -> Any:
    from sglang.srt.server_args import ServerArgs  # noqa: F401 - the parser needs SGLang's flags

    return launch_server.build_parser().parse_args(["--model-path", "m", *argv])


def test_a_remote_router_needs_its_public_key(tmp_path: Path) -> None:
    zmq.auth.create_certificates(str(tmp_path), "router")
    remote = ("--router-address", "tcp://10.0.0.1:30100", "--router-allow-remote")
    with pytest.raises(SystemExit, match="encrypted: give --router-curve-public-key"):
        launch_checks._router_settings(_parse(*remote), 31000, None, True)
    settings = launch_checks._router_settings(
        _parse(*remote, "--router-curve-public-key", str(tmp_path / "router.key"), "--advertise-host", "10.0.0.9"),
        31000,
        None,
        True,
    )
    assert settings["router_curve_public_key"] == str(tmp_path / "router.key")
    assert settings["advertise_host"] == "10.0.0.9"
    with pytest.raises(SystemExit, match="not a readable CURVE certificate"):
        launch_checks._router_settings(_parse(*remote, "--router-curve-public-key", str(tmp_path / "x")), 1, None, True)
    with pytest.raises(SystemExit, match="only with --router-curve-public-key"):
        launch_checks._router_settings(
            _parse(*remote, "--worker-curve-secret-key", str(tmp_path / "router.key_secret")), 1, None, True
        )


def test_pd_kv_transfer_is_announced_where_peers_reach_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import router.transport

    monkeypatch.setattr(router.transport, "local_address_towards", lambda address: "10.231.0.2")
    pd = ["--disaggregation-mode", "prefill"]
    assert kv_host_ip([*pd, "--advertise-host", "10.9.9.9"]) == "10.9.9.9"
    assert kv_host_ip([*pd, "--router-address", "tcp://10.231.0.1:30100"]) == "10.231.0.2"
    assert kv_host_ip([*pd, "--router-address", "tcp://127.0.0.1:30100"]) is None  # SGLang's loopback on CPU
    assert kv_host_ip(["--advertise-host", "10.9.9.9"]) is None  # not a PD worker


def test_the_local_address_towards_a_router() -> None:
    from router.transport import local_address_towards

    assert local_address_towards("tcp://127.0.0.1:30100") == "127.0.0.1"
    assert local_address_towards("ipc:///tmp/x") is None


def _agent_config(monkeypatch: pytest.MonkeyPatch, host: str, **membership: Any) -> Any:
    from server import sglang_http, worker_agent
    from server.draining import Drain

    captured: list[Any] = []
    monkeypatch.setattr(
        worker_agent,
        "start_agent_thread",
        lambda config, engine, drain: captured.append(config) or SimpleNamespace(hand_back=lambda: None),
    )
    server_args = SimpleNamespace(
        host=host, port=31000, model_path="m", api_key=None, disaggregation_mode="null", disaggregation_bootstrap_port=1
    )
    config = SimpleNamespace(emulate_slowdown=1.0, emulate_profile=None)
    member = sglang_http.RouterMembership("tcp://127.0.0.1:30100", "w0", "cpu", **membership)
    sglang_http._join_router(server_args, config, member, None, dict, Drain(), [])
    return captured[0]


def test_a_worker_on_every_interface_advertises_a_wildcard_and_calls_itself_locally(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    agent = _agent_config(monkeypatch, "0.0.0.0")
    assert agent.http_url == "http://127.0.0.1:31000"  # its own /generate calls
    assert agent.advertised_url == "http://0.0.0.0:31000"  # the router puts the connection's address in
    assert agent.curve is None
    zmq.auth.create_certificates(str(tmp_path), "router")
    agent = _agent_config(
        monkeypatch, "0.0.0.0", advertise_host="fd00::2", router_curve_public_key=str(tmp_path / "router.key")
    )
    assert agent.advertised_url == "http://[fd00::2]:31000"
    assert agent.curve is not None and agent.curve.server_public is not None
    assert _agent_config(monkeypatch, "10.0.0.3").advertised_url == "http://10.0.0.3:31000"
