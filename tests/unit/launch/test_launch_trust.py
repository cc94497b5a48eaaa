"""launch_server's and launch_cluster's worker credential: where a worker's secret comes from
(never the client key alone, unless it must stand in), and a cluster's shared secret per run."""

from __future__ import annotations

import types

import pytest

from launch_checks import _router_settings
from router.worker_auth import SECRET_ENV, legacy_secret


def _args(**kw: object) -> types.SimpleNamespace:
    base = {
        "router_address": "tcp://127.0.0.1:30100",
        "router_allow_remote": False,
        "worker_id": "w0",
        "worker_gpu": "cpu",
        "worker_tier_ms": None,
        "worker_secret": None,
        "worker_secret_file": None,
        "api_key": None,
        "router_curve_public_key": None,
        "worker_curve_secret_key": None,
        "advertise_host": None,
    }
    return types.SimpleNamespace(**{**base, **kw})


@pytest.fixture(autouse=True)
def _no_env_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SECRET_ENV, raising=False)


def test_a_workers_secret_comes_from_its_flags_or_stands_in_from_the_api_key() -> None:
    assert _router_settings(_args(worker_secret="sixteen bytes or more"), 1, None, True)["worker_secret"] == (
        b"sixteen bytes or more"
    )
    assert _router_settings(_args(api_key="k"), 1, None, True)["worker_secret"] == legacy_secret("k")
    assert _router_settings(_args(), 1, None, True)["worker_secret"] is None
    with pytest.raises(SystemExit, match="--worker-secret"):
        _router_settings(_args(worker_secret="short"), 1, None, True)
    with pytest.raises(SystemExit, match="only with --router-address"):
        _router_settings(
            _args(router_address=None, worker_id=None, worker_gpu=None, worker_secret="x" * 20), 1, None, True
        )


def test_a_cluster_shares_one_secret_made_for_the_run() -> None:
    from launch_cluster import Cluster
    from launch_cluster_spec import parse_cluster_spec

    spec = parse_cluster_spec({"router": {}, "workers": [{"gpu": "h100", "count": 2}]})
    first, second = Cluster(spec.workers, spec.router), Cluster(spec.workers, spec.router)  # nothing starts
    secrets = {srv.env[SECRET_ENV] for srv in [*first.servers, first.router]}  # type: ignore[index, union-attr]
    assert len(secrets) == 1 and len(secrets.pop()) >= 32
    assert first.env[SECRET_ENV] != second.env[SECRET_ENV]
