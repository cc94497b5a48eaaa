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
    assert kinds == [
        *["Deployment"] * 3,
        *["NetworkPolicy"] * 2,
        "PersistentVolumeClaim",
        *["Secret"] * 2,
        *["Service"] * 2,
    ]


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


def test_selectors_match_their_pods_and_the_services_find_the_router() -> None:
    for _, doc in documents():
        if doc["kind"] != "Deployment":
            continue
        labels = doc["spec"]["template"]["metadata"]["labels"]
        assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), doc["metadata"]["name"]
    (router,) = [
        doc for _, doc in documents() if doc["metadata"]["name"] == "sglang-slo-router" and doc["kind"] == "Deployment"
    ]
    pod_labels = router["spec"]["template"]["metadata"]["labels"]
    container_ports = {p["name"] for p in router["spec"]["template"]["spec"]["containers"][0]["ports"]}
    services = [doc for _, doc in documents() if doc["kind"] == "Service"]
    assert {s["metadata"]["name"] for s in services} == {"sglang-slo-router", "sglang-slo-router-workers"}
    for service in services:
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def secrets() -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in documents() if doc["kind"] == "Secret"}


def mounted_files(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Path in the container -> (Secret, key) of every Secret item the container mounts."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    out = {}
    for mount in container.get("volumeMounts", []):
        secret = volumes[mount["name"]].get("secret")
        if secret is None or "items" not in secret:
            continue
        for item in secret["items"]:
            out[f"{mount['mountPath']}/{item['path']}"] = (secret["secretName"], item["key"])
    return out


def test_every_secret_key_a_container_reads_exists() -> None:
    known = secrets()
    for deployment, pod, container in containers():
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["key"] in known[ref["name"]]["stringData"], (deployment, ref)
        for path, (secret, key) in mounted_files(pod, container).items():
            if secret in known:  # the CURVE Secrets are made from key files (docs/deployment.md)
                assert key in known[secret]["stringData"], (deployment, path)


def access_file(container: dict[str, Any]) -> str:
    (flag,) = [a for a in container["args"] if a.startswith("--auth-config=")]
    return flag.partition("=")[2]


def test_every_key_an_access_file_names_is_mounted_and_no_client_key_reaches_a_worker() -> None:
    """Each container reads its access file and every key it names from its own mounts; the
    workers' file and mounts hold no tenant key, and each role appears where it is needed."""
    from router.access import Role

    for deployment, pod, container in containers():
        files = mounted_files(pod, container)
        secret, key = files[access_file(container)]
        entries = yaml.safe_load(secrets()[secret]["stringData"][key])["keys"]
        for entry in entries:
            assert entry["key_file"] in files, (deployment, entry["name"])
        roles = {Role(e["role"]) for e in entries}
        assert {Role.ADMIN, Role.METRICS, Role.WORKER} <= roles, deployment
        if container["name"] == "worker":
            mounted_keys = {k for s, k in files.values() if s == "sglang-slo-keys"}
            assert not any(k.startswith("tenant") for k in mounted_keys), deployment
            assert not any(e["role"] == "client" for e in entries), deployment
        else:
            assert sum(e["role"] == "client" for e in entries) >= 2  # the multi-tenant example


def test_no_key_is_on_a_command_line() -> None:
    """`ps` shows arguments to every user of the node: keys come from files."""
    for deployment, _, container in containers():
        for arg in container["args"]:
            assert not re.match(r"--(api-key|admin-api-key|worker-secret)(=|$)", arg), (deployment, arg)


def test_queues_are_bounded() -> None:
    for deployment, _, container in containers():
        bounds = [a for a in container["args"] if a.startswith("--max-queued-requests=")]
        assert len(bounds) == 1 and int(bounds[0].partition("=")[2]) > 0, deployment


def _args(container: dict[str, Any], paths: dict[str, str]) -> list[str]:
    """The container's arguments as its process gets them: $(VAR) filled, paths made local."""
    values = {"POD_IP": "10.1.2.3", "POD_NAME": "sglang-slo-worker-h100-6d9c5b7f4-x2x9z"}
    out = []
    for arg in container["args"]:
        arg = re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], arg)
        for remote, local in paths.items():
            arg = arg.replace(remote, local)
        out.append(arg)
    return out


def materialize_secrets(root: Path) -> dict[str, str]:
    """The Secrets' files as the pods see them, written under `root`: the keys of sglang-slo-keys
    and the access files of sglang-slo-auth (their key paths made local). Returns the mapping
    from the pods' folders to the local ones."""
    keys, auth = root / "keys", root / "auth"
    keys.mkdir()
    auth.mkdir()
    known = secrets()
    for name, value in known["sglang-slo-keys"]["stringData"].items():
        (keys / name).write_text(value)
        (keys / name).chmod(0o400)
    for name, text in known["sglang-slo-auth"]["stringData"].items():
        (auth / name).write_text(text.replace("/etc/sglang-slo/keys", str(keys)))
    return {"/etc/sglang-slo/keys": str(keys), "/etc/sglang-slo/auth": str(auth)}


@pytest.fixture
def local_paths(tmp_path: Path) -> dict[str, str]:
    zmq.auth.create_certificates(str(tmp_path), "router")
    (tmp_path / "model").mkdir()
    return {
        "/etc/sglang-slo/curve": str(tmp_path),
        "/models/Llama-3.1-8B-Instruct": str(tmp_path / "model"),
        **materialize_secrets(tmp_path),
    }


def test_the_router_container_passes_launch_routers_checks(local_paths: dict[str, str]) -> None:
    """Its flags and access file load: the tenants, operators and Prometheus by role, the worker
    secret from the file."""
    import launch_router
    from router.access import Role

    ((_, _, container),) = [c for c in containers() if c[2]["name"] == "router"]
    assert container["command"] == ["python", "-m", "launch_router"]
    config = launch_router.config_from_args(launch_router.build_parser().parse_args(_args(container, local_paths)))
    assert config.curve_secret_key and config.allow_remote_workers and config.tokenizer_path
    assert config.max_queued_requests and config.worker_secret == stored_key("worker-secret").encode()
    roles = {p.name: p.role for p in config.access.principals()}
    assert roles == {"ops": Role.ADMIN, "prometheus": Role.METRICS, "tenant-a": Role.CLIENT, "tenant-b": Role.CLIENT}
    tenant = config.access.authenticate(f"Bearer {stored_key('tenant-a')}")
    assert tenant is not None and tenant.limits is not None and tenant.share == 2


def stored_key(name: str) -> str:
    return secrets()["sglang-slo-keys"]["stringData"][name]


def test_every_worker_container_passes_launch_servers_checks(local_paths: dict[str, str]) -> None:
    """Its flags and access file load: operators and Prometheus only, the router link's secret
    from the file; no client key is accepted."""
    import launch_server
    from server.worker_access import access_for, resolve_key_flags

    workers = [c for c in containers() if c[2]["name"] == "worker"]
    assert len(workers) == 2
    for deployment, pod, container in workers:
        assert container["command"] == ["python", "-m", "launch_server"]
        args = launch_server.build_parser().parse_args(_args(container, local_paths))
        resolve_key_flags(args, env={})
        access = access_for(args)
        settings = launch_server._router_settings(args, args.port, None, False, access.table.worker_secret())
        assert settings["router_curve_public_key"] and settings["advertise_host"] == "10.1.2.3", deployment
        assert settings["worker_secret"] == stored_key("worker-secret").encode(), deployment
        assert {p.name for p in access.table.principals()} == {"ops", "prometheus"}, deployment
        assert access.table.authenticate(f"Bearer {stored_key('tenant-a')}") is None, deployment
        prometheus = f"Bearer {stored_key('metrics')}".encode()
        assert access.check("GET", "/metrics", prometheus).allowed, deployment  # Prometheus scrapes
        assert access.check("GET", "/metrics", None).status == 401, deployment
        assert access.check("POST", "/abort_request", prometheus).status == 403, deployment
        assert access.check("GET", "/health_generate", None).allowed, deployment  # the kubelet's probe
        assert args.max_queued_requests, deployment
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["readinessProbe"]["httpGet"]["path"] == "/health_generate"  # a real generation
        http = next(p["containerPort"] for p in container["ports"] if p["name"] == "http")
        assert args.port == http == int(pod.get("annotations", {}).get("prometheus.io/port", http))
