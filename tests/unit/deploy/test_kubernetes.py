"""deploy/kubernetes: every manifest valid against the Kubernetes API schemas (kubernetes-validate,
offline, strict: no unknown field), every container's flags accepted by our own launchers, and
the wiring between the objects (selectors, Secret keys, ports) consistent."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
import zmq.auth

ROOT = Path(__file__).resolve().parents[3]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
KUBERNETES_VERSIONS = ("1.30", "1.33")  # what clusters run today, old and new


def documents() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def containers(kind: str = "Deployment") -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(deployment name, pod spec, container) of every container."""
    out = []
    for _, doc in documents():
        if doc["kind"] == kind:
            pod = doc["spec"]["template"]["spec"]
            out += [(doc["metadata"]["name"], pod, c) for c in pod["containers"]]
    return out


def test_the_manifests_exist() -> None:
    kinds = sorted(doc["kind"] for _, doc in documents())
    assert kinds == ["Deployment", "Deployment", "Deployment", "PersistentVolumeClaim", "Secret", "Service"]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_validates_against_the_api_schema(version: str) -> None:
    try:
        import kubernetes_validate  # bundles the API schemas: no network
    except ImportError:
        pytest.fail("kubernetes-validate is missing: ./slo setup installs it (setup/requirements-project.txt)")

    for name, doc in documents():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{name}: {doc['kind']} {doc['metadata']['name']}: {e.message} at {list(e.path)}")


def test_selectors_match_their_pods_and_the_service_finds_the_router() -> None:
    services = [doc for _, doc in documents() if doc["kind"] == "Service"]
    for _, doc in documents():
        if doc["kind"] != "Deployment":
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), doc["metadata"]["name"]
    (router,) = [
        doc for _, doc in documents() if doc["metadata"]["name"] == "sglang-slo-router" and doc["kind"] == "Deployment"
    ]
    pod_labels = router["spec"]["template"]["metadata"]["labels"]
    (service,) = services
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for p in router["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_every_secret_key_a_container_reads_exists() -> None:
    secrets = {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == "Secret"}
    for deployment, _, container in containers():
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in secrets[ref["name"]]["stringData"], (deployment, ref)


def _args(container: dict[str, Any], paths: dict[str, str]) -> list[str]:
    """The container's arguments as its process gets them: $(VAR) filled, paths made local."""
    values = {"POD_IP": "10.1.2.3", "POD_NAME": "sglang-slo-worker-h100-6d9c5b7f4-x2x9z", "API_KEY": "key"}
    out = []
    for arg in container["args"]:
        arg = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg)
        for remote, local in paths.items():
            arg = arg.replace(remote, local)
        out.append(arg)
    return out


@pytest.fixture
def local_paths(tmp_path: Path) -> dict[str, str]:
    zmq.auth.create_certificates(str(tmp_path), "router")
    (tmp_path / "model").mkdir()
    return {"/etc/sglang-slo/curve": str(tmp_path), "/models/Llama-3.1-8B-Instruct": str(tmp_path / "model")}


def test_the_router_container_passes_launch_routers_checks(local_paths: dict[str, str]) -> None:
    import launch_router

    ((_, _, container),) = [c for c in containers() if c[2]["name"] == "router"]
    assert container["command"] == ["python", "-m", "launch_router"]
    config = launch_router.config_from_args(launch_router.build_parser().parse_args(_args(container, local_paths)))
    assert config.curve_secret_key and config.allow_remote_workers and config.tokenizer_path


def test_every_worker_container_passes_launch_servers_checks(local_paths: dict[str, str]) -> None:
    import launch_server

    workers = [c for c in containers() if c[2]["name"] == "worker"]
    assert len(workers) == 2
    for deployment, pod, container in workers:
        assert container["command"] == ["python", "-m", "launch_server"]
        args = launch_server.build_parser().parse_args(_args(container, local_paths))
        settings = launch_server._router_settings(args, args.port, None, False)
        assert settings["router_curve_public_key"] and settings["advertise_host"] == "10.1.2.3", deployment
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["readinessProbe"]["httpGet"]["path"] == "/health_generate"  # a real generation
        http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
        assert args.port == http == int(pod.get("annotations", {}).get("prometheus.io/port", http))
