"""Emulation flags and the cluster file: profiles resolve, bad input is refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch_cluster_spec import ClusterConfigError, load_cluster, load_cluster_spec, parse_cluster, parse_cluster_spec
from server.emulation import available, is_tiny_draft, is_tiny_model, resolve, stand_in_applies, startup_flags
from server.models import TINY_MODEL_NAME, cache_dir

ROOT = Path(__file__).resolve().parents[3]


def test_shipped_profiles_resolve_with_their_cards_kv_capacity() -> None:
    assert {"h100/llama3-8b", "a100/llama3-8b", "a40/llama3-8b"} <= set(available())
    h100, a40 = resolve("h100"), resolve("a40")
    assert h100.name == "h100/llama3-8b" and h100.profile.is_file()
    assert h100.kv_token_capacity > a40.kv_token_capacity > 100_000  # 80 GB vs 48 GB minus 16 GB of weights


def test_an_unknown_gpu_names_what_exists() -> None:
    with pytest.raises(ValueError, match="h100/llama3-8b"):
        resolve("tpu9")


def test_startup_flags_fill_only_what_the_user_left_out() -> None:
    emu = resolve("a100")
    given: set[str] = {"--max-total-tokens"}
    flags = startup_flags(emu, lambda *names: any(n in given for n in names))
    assert flags[:2] == ["--model-path", "tiny"]
    assert "--max-total-tokens" not in flags and "--context-length" in flags


def test_the_tiny_model_and_its_drafts_skip_their_layers() -> None:
    tiny_folder = str(cache_dir() / "models" / f"{TINY_MODEL_NAME}-0")
    draft_folder = str(cache_dir() / "models" / f"{TINY_MODEL_NAME}-0-draft0.08")
    assert is_tiny_model("tiny") and is_tiny_model(tiny_folder)
    assert not is_tiny_model(draft_folder)
    assert not is_tiny_model("/models/Llama-3-8B") and not is_tiny_model(None)
    assert is_tiny_draft("tiny-draft") and is_tiny_draft(draft_folder) and not is_tiny_draft(tiny_folder)
    assert stand_in_applies(tiny_folder, draft_path=None, full_forward=False)  # no speculation, or NGRAM
    assert stand_in_applies(tiny_folder, draft_path=draft_folder, full_forward=False)  # STANDALONE tiny-draft
    eagle, eagle3 = (str(cache_dir() / "models" / f"{TINY_MODEL_NAME}-0-{kind}") for kind in ("eagle", "eagle3"))
    assert stand_in_applies(tiny_folder, draft_path=eagle, full_forward=False)
    # an EAGLE3 target captures hidden states the stand-in has none of
    assert not stand_in_applies(tiny_folder, draft_path=eagle3, full_forward=False)
    assert not stand_in_applies("tiny", draft_path=None, full_forward=True)
    assert not stand_in_applies("/models/Llama-3-8B", draft_path=None, full_forward=False)  # a real model


def test_the_example_cluster_file_parses() -> None:
    specs = load_cluster(ROOT / "examples" / "cluster-h100-a40.yaml")
    assert [s.gpu for s in specs] == ["h100", "a40"]
    assert [s.port for s in specs] == [31000, 31001]
    assert specs[0].argv()[:4] == ["--emulate-gpu", "h100", "--emulate-model", "llama3-8b"]
    assert "--slo-policy" in specs[1].argv()


def test_counts_expand_and_ports_skip_explicit_ones() -> None:
    specs = parse_cluster(
        {"base_port": 100, "workers": [{"gpu": "a40", "port": 101}, {"gpu": "h100", "count": 2, "args": ["-x", 1]}]}
    )
    assert [(s.gpu, s.port) for s in specs] == [("a40", 101), ("h100", 100), ("h100", 102)]
    assert specs[1].args == ["-x", "1"]


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"workers": [{"gpu": "h100", "cnt": 2}]}, "cnt"),
        ({"workers": [{"gpu": "tpu9"}]}, "workers[0].gpu"),
        ({"workers": [{"gpu": "h100", "count": 0}]}, "workers[0].count"),
        ({"workers": [{"gpu": "h100", "count": 2, "port": 5}]}, "workers[0].port"),
        ({"workers": [{"gpu": "h100", "args": "--x"}]}, "workers[0].args"),
        ({"workers": []}, "workers"),
        ({"worker": []}, "worker"),
        ({"workers": [{"gpu": "h100", "port": 7}, {"gpu": "a40", "port": 7}]}, "share a port"),
    ],
)
def test_bad_cluster_files_are_refused_naming_the_key(data: dict, names: str) -> None:
    with pytest.raises(ClusterConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster(data)


def test_the_router_section_and_real_model_workers_parse() -> None:
    spec = parse_cluster_spec(
        {
            "router": {"port": 30000, "policy": "polyserve", "params": {"tiers_ms": [25, 50]}, "args": ["--x", 1]},
            "workers": [{"model_path": "tiny"}, {"gpu": "a40"}],
        }
    )
    assert spec.router is not None
    argv = spec.router.argv(4000)
    assert argv[:4] == ["--worker-port", "4000", "--routing-policy", "polyserve"]
    assert argv[4:] == ["--routing-policy-param", "tiers_ms=[25, 50]", "--x", "1"]
    real, emulated = spec.workers
    assert (real.gpu, real.argv()) == (None, ["--model-path", "tiny"])
    assert emulated.argv()[:2] == ["--emulate-gpu", "a40"]
    assert load_cluster_spec(ROOT / "examples" / "cluster-h100-a40.yaml").router is not None


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"router": {"policy": "fastest"}, "workers": [{"gpu": "h100"}]}, "router.policy"),
        ({"router": {"prot": 1}, "workers": [{"gpu": "h100"}]}, "prot"),
        ({"router": {"port": "x"}, "workers": [{"gpu": "h100"}]}, "router.port"),
        ({"router": {"params": [1]}, "workers": [{"gpu": "h100"}]}, "router.params"),
        ({"router": [], "workers": [{"gpu": "h100"}]}, "router"),
        ({"workers": [{"model_path": "tiny", "gpu": "h100"}]}, "workers[0].model_path"),
        ({"workers": [{"model": "llama3-8b"}]}, "workers[0].gpu"),
    ],
)
def test_bad_router_sections_are_refused_naming_the_key(data: dict, names: str) -> None:
    with pytest.raises(ClusterConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster_spec(data)


def test_the_console_line_of_every_process_formats() -> None:
    from launch_cluster import describe_line

    router = {"name": "router", "gpu": None, "model": None, "url": "http://127.0.0.1:30000", "pid": 7}
    worker = {"name": "h100-0", "gpu": "h100", "model": "llama3-8b", "url": "http://127.0.0.1:31000", "pid": 8}
    assert "router" in describe_line(router) and "pid 7" in describe_line(router)
    assert "h100/llama3-8b" in describe_line(worker) and "31000" in describe_line(worker)


def test_the_example_pd_cluster_file_parses() -> None:
    spec = load_cluster_spec(ROOT / "examples" / "cluster-pd.yaml")
    assert spec.router is not None and spec.router.policy == "polyserve"
    prefill, fast, slow = spec.workers
    assert [(w.role, w.tier_ms) for w in spec.workers] == [("prefill", None), ("decode", 50.0), ("decode", 100.0)]
    assert prefill.argv()[4:8] == ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "32000"]
    assert fast.argv()[4:8] == ["--disaggregation-mode", "decode", "--worker-tier-ms", "50"]
    assert "--disaggregation-bootstrap-port" not in slow.argv() and slow.argv()[-2:] == ["--max-running-requests", "64"]
    assert [w.name for w in spec.workers] == ["h100-prefill-0", "h100-decode-1", "h100-decode-2"]


def test_bootstrap_ports_step_past_every_taken_port() -> None:
    spec = parse_cluster_spec(
        {
            "base_port": 100,
            "router": {"port": 1101, "worker_port": 1104},
            "workers": [
                {"gpu": "h100", "role": "prefill", "count": 2},  # HTTP 100, 101
                {"gpu": "h100", "role": "decode", "port": 1100},
                {"gpu": "h100", "tier_ms": 25.5},  # co-located, HTTP 102
            ],
        }
    )
    # 1100: a worker's HTTP port, 1101: the router's → 1102; then 1101 and 1102 are taken → 1103
    assert [w.bootstrap_port for w in spec.workers] == [1102, 1103, None, None]
    colocated = spec.workers[3].argv()
    assert "--disaggregation-mode" not in colocated and colocated[4:] == ["--worker-tier-ms", "25.5"]


def test_a_prefill_worker_without_a_port_gets_its_bootstrap_port_at_start() -> None:
    from launch_cluster import Cluster

    spec = parse_cluster_spec(
        {"router": {}, "workers": [{"gpu": "h100", "role": "prefill"}, {"gpu": "a40", "role": "decode"}]}
    )
    prefill = spec.workers[0]
    assert prefill.bootstrap_port is None
    with pytest.raises(ValueError, match="bootstrap port"):
        prefill.argv()
    cluster = Cluster(spec.workers, spec.router)  # builds the processes, starts nothing
    try:
        assert cluster.router is not None and cluster.worker_port is not None
        ports = [srv.port for srv in cluster.servers]
        used = [*ports, cluster.router.port, cluster.worker_port, prefill.bootstrap_port]
        assert None not in used and len(set(used)) == len(used)  # nothing handed out twice
        args = cluster.servers[0].args
        assert args[args.index("--disaggregation-bootstrap-port") + 1] == str(prefill.bootstrap_port)
        assert cluster.describe()[1]["role"] == "prefill" and cluster.describe()[2]["role"] == "decode"
    finally:
        for srv in [*cluster.servers, cluster.router]:
            if srv is not None:
                srv.log_path.unlink(missing_ok=True)


@pytest.mark.parametrize(
    ("workers", "names"),
    [
        ([{"gpu": "h100", "role": "both"}], "workers[0].role"),
        ([{"gpu": "h100", "role": "prefill"}, {"gpu": "h100", "role": "decode", "tier_ms": "x"}], "workers[1].tier_ms"),
        ([{"gpu": "h100", "tier_ms": 0}], "workers[0].tier_ms"),
        ([{"gpu": "h100", "tier_ms": True}], "workers[0].tier_ms"),
        ([{"gpu": "h100", "role": "prefill", "tier_ms": 50}, {"gpu": "h100", "role": "decode"}], "workers[0].tier_ms"),
        (
            [{"gpu": "h100", "role": "decode"}, {"gpu": "h100"}],
            "decode workers need at least one worker with role: prefill",
        ),
        (
            [{"gpu": "h100", "role": "prefill", "count": 2}],
            "prefill workers need at least one worker with role: decode",
        ),
    ],
)
def test_bad_pd_workers_are_refused_naming_the_key(workers: list, names: str) -> None:
    with pytest.raises(ClusterConfigError, match=names.replace("[", r"\[").replace("]", r"\]")):
        parse_cluster_spec({"router": {"policy": "polyserve"}, "workers": workers})


@pytest.mark.parametrize(
    ("workers", "names"),
    [
        ([{"gpu": "h100", "role": "prefill"}, {"gpu": "h100", "role": "decode"}], "workers[0].role"),
        ([{"gpu": "h100"}, {"gpu": "h100", "tier_ms": 50}], "workers[1].tier_ms"),
    ],
)
def test_pd_roles_and_tiers_need_a_router(workers: list, names: str) -> None:
    with pytest.raises(ClusterConfigError, match=names.replace("[", r"\[").replace("]", r"\]") + ": needs a router"):
        parse_cluster_spec({"workers": workers})
