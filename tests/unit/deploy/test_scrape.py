"""The shipped Prometheus configuration scrapes the shipped router: a real router process started
with the arguments and access file of deploy/kubernetes/router.yaml, a worker joined to it over
CurveZMQ with the manifests' worker secret (a scripted stand-in for the agent, on a real ZMQ
socket), one client request through it, then /metrics fetched with the credentials that
deploy/monitoring/prometheus.yml's router job sends. Every series of the Grafana dashboard's
router panels has samples; without the key the scrape is refused."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
import zmq.asyncio
import zmq.auth
from prometheus_client.parser import text_string_to_metric_families

from router.transport import CurveKeys, WorkerEndpoint
from server.process import ServerProcess, free_port
from tests.unit.deploy.test_kubernetes import _args, containers, documents, materialize_secrets, secrets
from tests.unit.deploy.test_monitoring import DASHBOARD, PROMETHEUS, _relabel, _sanitize
from tests.unit.router._router_harness import ScriptedWorker, tiny_path

# Where the Prometheus pod finds the Secret sglang-slo-metrics (docs/deployment.md, "Monitoring"):
# made from the same value as the `metrics` key of sglang-slo-keys.
PROMETHEUS_SECRET_DIR = "/etc/prometheus/secrets/sglang-slo-metrics"
# Panels that read series only one routing policy exports, and that policy.
POLICY_PANELS = {"TPOT tiers (PolyServe)": "polyserve"}
# A latency request within tenant-a's limits: its TPOT puts it in a PolyServe tier.
REQUEST = {"text": "hi", "sampling_params": {"max_new_tokens": 4}, "slo": {"ttft_ms": 5000, "tpot_ms": 1000}}
Deployed = tuple[ServerProcess, dict[str, str], str, str]  # router, local paths, worker address, policy


def router_job(config_path: Path = PROMETHEUS) -> dict[str, Any]:
    """The scrape job of prometheus.yml that keeps the router's pods (its relabelling applied to
    the router pod of the manifests)."""
    config = yaml.safe_load(config_path.read_text())
    (router,) = [
        d for _, d in documents() if d["kind"] == "Deployment" and d["metadata"]["name"] == "sglang-slo-router"
    ]
    template = router["spec"]["template"]
    meta = {"__address__": "10.1.2.3:9999"}
    meta |= {f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in template["metadata"]["labels"].items()}
    meta |= {
        f"__meta_kubernetes_pod_annotation_{_sanitize(k)}": v for k, v in template["metadata"]["annotations"].items()
    }
    (job,) = [
        j for j in config["scrape_configs"] if "kubernetes_sd_configs" in j and _relabel(j["relabel_configs"], meta)
    ]
    return job


def scrape_headers(job: dict[str, Any], local: dict[str, str]) -> dict[str, str]:
    """The Authorization header Prometheus sends for `job` (none without `authorization`), its
    key file read from `local`."""
    auth = job.get("authorization")
    if auth is None:
        return {}
    path = auth["credentials_file"]
    for remote, here in local.items():
        path = path.replace(remote, here)
    return {"Authorization": f"{auth.get('type', 'Bearer')} {Path(path).read_text().strip()}"}


def router_panel_series(policy: str) -> dict[str, set[str]]:
    """Panel title -> the series names its queries read from the router."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = {}
    for panel in dashboard["panels"]:
        if POLICY_PANELS.get(panel["title"], policy) != policy:
            continue
        names: set[str] = set()
        for target in panel["targets"]:
            expr = target["expr"]
            if 'component="router"' in expr or "$component" in expr:
                names |= set(re.findall(r"\bsglang_[a-z0-9_]+\b", expr))
        if names:
            out[panel["title"]] = names
    return out


def sampled(text: str) -> set[str]:
    """Every series name with at least one sample."""
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


class CurveWorker(ScriptedWorker):
    """The scripted worker on an encrypted link, as a worker outside the router's host joins."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str, public_key: str, secret: bytes) -> None:
        super().__init__(ctx, address, "w-scrape", secret=secret)
        self.endpoint.close()
        self.endpoint = WorkerEndpoint(address, "w-scrape", ctx=ctx, curve=CurveKeys.for_worker(public_key))


def manifest_policy() -> str:
    ((_, _, container),) = [c for c in containers() if c[2]["name"] == "router"]
    return next(a.partition("=")[2] for a in container["args"] if a.startswith("--routing-policy="))


# The manifests' policy, and each policy a panel is kept for.
POLICIES = sorted({manifest_policy(), *POLICY_PANELS.values()})


@pytest.fixture(scope="module", params=POLICIES)
def deployed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployed]:
    """The manifests' router on loopback: (process, local paths of the pods' files, worker address)."""
    root = tmp_path_factory.mktemp("deploy")
    zmq.auth.create_certificates(str(root), "router")
    local = {"/etc/sglang-slo/curve": str(root), "/models/Llama-3.1-8B-Instruct": tiny_path()}
    local |= materialize_secrets(root)
    prometheus = root / "prometheus"
    prometheus.mkdir()
    shutil.copy(Path(local["/etc/sglang-slo/keys"]) / "metrics", prometheus / "metrics")
    local[PROMETHEUS_SECRET_DIR] = str(prometheus)

    ((_, _, container),) = [c for c in containers() if c[2]["name"] == "router"]
    worker_address = f"tcp://127.0.0.1:{free_port()}"
    args = [a for a in _args(container, local) if not a.startswith(("--host=", "--port=", "--worker-bind="))]
    args = [f"--routing-policy={request.param}" if a.startswith("--routing-policy=") else a for a in args]
    metrics_key = (prometheus / "metrics").read_text()
    router = ServerProcess(
        *args,
        "--worker-bind",
        worker_address,
        name="router-scrape",
        module="launch_router",
        ready_path="/metrics",
        api_key=metrics_key,
    )
    router.start()
    try:
        yield router, local, worker_address, request.param
    finally:
        router.stop()


def key(local: dict[str, str], name: str) -> str:
    return (Path(local["/etc/sglang-slo/keys"]) / name).read_text()


async def serve_one_request(router: ServerProcess, local: dict[str, str], address: str) -> None:
    """A worker joins, one tenant request is served. On the way, the router's readiness probe
    behaves as the readiness model (_cluster_model.py) takes it: 503 until a worker has joined,
    then 200."""
    ctx = zmq.asyncio.Context()
    worker = CurveWorker(
        ctx, address, f"{local['/etc/sglang-slo/curve']}/router.key", key(local, "worker-secret").encode()
    )
    try:
        async with httpx.AsyncClient(base_url=router.url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 503  # running, not Ready: no worker yet
            await worker.start()
            while (await http.get("/health")).status_code != 200:
                await asyncio.sleep(0.05)
            client = {"Authorization": f"Bearer {key(local, 'tenant-a')}"}
            resp = await http.post("/generate", json=REQUEST, headers=client)
            assert resp.status_code == 200, resp.text
    finally:
        await worker.stop()
        ctx.destroy(linger=0)


def test_the_router_panels_have_data_when_scraped_as_prometheus_is_configured(
    deployed: Deployed,
) -> None:
    router, local, address, policy = deployed
    asyncio.run(asyncio.wait_for(serve_one_request(router, local, address), 60))
    resp = httpx.get(router.url + "/metrics", headers=scrape_headers(router_job(), local), timeout=10)
    assert resp.status_code == 200, resp.text
    have = sampled(resp.text)
    panels = router_panel_series(policy)
    assert len(panels) >= 8  # the dashboard was really read
    empty = {title: sorted(names - have) for title, names in panels.items() if names - have}
    assert not empty, f"router panels without data: {empty}"


def test_a_scrape_without_the_metrics_key_is_refused(deployed: Deployed) -> None:
    router, local, _, _ = deployed
    assert httpx.get(router.url + "/metrics", timeout=10).status_code == 401
    tenant = {"Authorization": f"Bearer {key(local, 'tenant-a')}"}
    assert httpx.get(router.url + "/metrics", headers=tenant, timeout=10).status_code == 403
    assert secrets()["sglang-slo-keys"]["stringData"]["metrics"] == key(local, "metrics")
