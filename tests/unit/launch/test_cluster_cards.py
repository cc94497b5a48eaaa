"""launch_cluster on GPU machines: which cards each worker sees (gpu_ids -> CUDA_VISIBLE_DEVICES),
its static memory share (mem_fraction -> --mem-fraction-static), and the checks that keep
workers on one card from starving each other or a tensor-parallel worker short of cards."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from launch_cluster import Cluster
from launch_cluster_spec import ClusterConfigError, load_cluster_spec, parse_cluster

ROOT = Path(__file__).resolve().parents[3]


def _workers(*entries: dict[str, Any]) -> list[Any]:
    return parse_cluster({"workers": list(entries)})


def test_a_worker_sees_its_cards_and_takes_its_share() -> None:
    (spec,) = _workers({"model_path": "tiny", "gpu_ids": [1, 2], "mem_fraction": 0.8, "args": ["--tp-size", "2"]})
    assert spec.env() == {"CUDA_VISIBLE_DEVICES": "1,2"}
    argv = spec.argv()
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.8"
    assert argv.index("--mem-fraction-static") < argv.index("--tp-size")  # its own args come last and win
    (plain,) = _workers({"model_path": "tiny"})
    assert plain.env() == {} and "--mem-fraction-static" not in plain.argv()


def test_workers_sharing_a_card_must_each_set_a_share_that_fits() -> None:
    shared = {"model_path": "tiny", "gpu_ids": [0], "count": 2}
    with pytest.raises(ClusterConfigError, match="share card 0: each needs mem_fraction"):
        _workers(shared)
    with pytest.raises(ClusterConfigError, match="share card 0 with mem_fraction 1.2 in all"):
        _workers({**shared, "mem_fraction": 0.6})
    assert len(_workers({**shared, "mem_fraction": 0.45})) == 2
    assert len(_workers({"model_path": "tiny", "gpu_ids": [0]}, {"model_path": "tiny", "gpu_ids": [1]})) == 2


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"gpu_ids": [0], "args": ["--tp-size", "2"]}, "2 ranks .* need 2 cards"),
        ({"gpu_ids": [0, 1], "args": ["--tp-size=2", "--dp-size", "2"]}, "4 ranks"),
        ({"gpu_ids": []}, "non-empty list"),
        ({"gpu_ids": [0, 0]}, "distinct"),
        ({"gpu_ids": "0"}, "non-empty list"),
        ({"mem_fraction": 1.5}, "between 0 and 1"),
        ({"mem_fraction": True}, "between 0 and 1"),
    ],
)
def test_bad_cards_are_refused_naming_the_key(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message):
        _workers({"model_path": "tiny", **entry})


def test_the_gpu_example_parses_and_each_process_gets_its_cards() -> None:
    spec = load_cluster_spec(ROOT / "examples" / "cluster-gpu.yaml")
    assert [s.gpu_ids for s in spec.workers] == [[0], [0], [1, 2]]
    cluster = Cluster(spec.workers, spec.router)  # builds the processes, starts nothing
    envs = [server.env for server in cluster.servers]
    assert [env["CUDA_VISIBLE_DEVICES"] for env in envs] == ["0", "0", "1,2"]
    assert all(env.get("PATH") for env in envs)  # the launcher's own environment is kept
