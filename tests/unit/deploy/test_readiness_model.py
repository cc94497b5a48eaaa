"""deploy/kubernetes starts: over the real manifests, a model of the kubelet's probes, Service
endpoints and NetworkPolicy together with each process's dependencies (_cluster_model.py) reaches
a fixed point where every pod is Ready and every worker has joined. The same model finds the
deadlock of manifests where workers join through a Ready-only Service (as these once did), and
the NetworkPolicies keep clients off the workers and off the router's worker port."""

from __future__ import annotations

import copy
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.unit.deploy._cluster_model import (
    Cluster,
    Peer,
    Pod,
    Simulation,
    State,
    flag_ports_consistent,
    named,
    service_port_names_consistent,
)
from tests.unit.deploy.test_kubernetes import documents

NAMESPACES: dict[str, dict[str, str]] = {"monitoring": {}, "kube-system": {}, "clients": {}}  # beside ours
CLIENT = Peer("client", "clients", {})
PROMETHEUS = Peer("prometheus-0", "monitoring", {"app.kubernetes.io/name": "prometheus"})
DNS = Peer("coredns", "kube-system", {"k8s-app": "kube-dns"})

# The router and its one Service as they were: readiness on /health (a healthy worker) and the
# worker port behind the same Ready-only Service as the clients' port.
DEADLOCKING_ROUTER = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: sglang-slo-router}
spec:
  replicas: 1
  selector: {matchLabels: {app.kubernetes.io/name: sglang-slo-router}}
  template:
    metadata: {labels: {app.kubernetes.io/name: sglang-slo-router}}
    spec:
      containers:
        - name: router
          command: ["python", "-m", "launch_router"]
          args: [--host=0.0.0.0, --port=30000, --worker-bind=tcp://0.0.0.0:30100, --allow-remote-workers]
          ports:
            - {name: http, containerPort: 30000}
            - {name: workers, containerPort: 30100}
          readinessProbe: {httpGet: {path: /health, port: http}, periodSeconds: 5}
          livenessProbe: {tcpSocket: {port: http}, periodSeconds: 10}
---
apiVersion: v1
kind: Service
metadata: {name: sglang-slo-router}
spec:
  selector: {app.kubernetes.io/name: sglang-slo-router}
  ports:
    - {name: http, port: 30000, targetPort: http}
    - {name: workers, port: 30100, targetPort: workers}
"""


def manifests() -> list[dict[str, Any]]:
    return [copy.deepcopy(doc) for _, doc in documents()]


def cluster(docs: list[dict[str, Any]] | None = None) -> Cluster:
    return Cluster(manifests() if docs is None else docs, NAMESPACES)


def by_kind(c: Cluster, kind: str) -> list[Pod]:
    return [p for p in c.pods if p.kind == kind]


def set_worker_address(docs: list[dict[str, Any]], address: str) -> None:
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["spec"]["template"]["spec"]["containers"][0]["name"] == "worker":
            container = doc["spec"]["template"]["spec"]["containers"][0]
            container["args"] = [
                f"--router-address={address}" if a.startswith("--router-address") else a for a in container["args"]
            ]


def test_every_pod_becomes_ready_and_every_worker_joins() -> None:
    c = cluster()
    assert len(by_kind(c, "router")) == 1 and len(by_kind(c, "worker")) == 4  # the model saw the manifests
    state = Simulation(c).run()
    assert state.ready == {p.name for p in c.pods}
    assert state.registered == set(named(c.pods, "worker"))


def test_the_old_manifests_deadlock_in_the_model() -> None:
    """Workers joining through a Ready-only Service: nobody ever becomes Ready but the workers."""
    router_objects = ("Service", "NetworkPolicy")  # the old manifests had no NetworkPolicy
    docs = [d for d in manifests() if d["kind"] not in router_objects and d["metadata"]["name"] != "sglang-slo-router"]
    docs += list(yaml.safe_load_all(DEADLOCKING_ROUTER))
    set_worker_address(docs, "tcp://sglang-slo-router:30100")
    c = cluster(docs)
    state = Simulation(c).run()
    assert by_kind(c, "router") and not state.registered
    assert state.ready == set(named(c.pods, "worker"))  # the router never is


def test_without_publish_not_ready_addresses_the_shipped_manifests_deadlock() -> None:
    docs = manifests()
    for doc in docs:
        if doc["kind"] == "Service":
            doc["spec"].pop("publishNotReadyAddresses", None)
    c = cluster(docs)
    state = Simulation(c).run()
    assert not state.registered and not state.ready & set(named(c.pods, "router"))


def test_workers_pointed_at_the_clients_service_never_join() -> None:
    docs = manifests()
    set_worker_address(docs, "tcp://sglang-slo-router:30100")  # that Service has no worker port
    state = Simulation(cluster(docs)).run()
    assert not state.registered


def test_client_traffic_reaches_only_a_ready_router() -> None:
    c = cluster()
    sim = Simulation(c)
    (router,) = by_kind(c, "router")
    http = router.port("http")
    assert http is not None
    client_services = [
        svc for svc in c.services.values() if any(t == http for _, t in c.endpoints(svc, http, {router.name}))
    ]
    assert [s["metadata"]["name"] for s in client_services] == ["sglang-slo-router"]
    (svc,) = client_services
    assert c.endpoints(svc, http, ready=set()) == []  # a router that cannot serve gets no client
    assert c.endpoints(svc, http, sim.run().ready) == [(router, http)]
    assert c.allowed(CLIENT, router, http)


def test_every_worker_names_a_service_of_the_manifests_that_leads_to_the_routers_worker_port() -> None:
    c = cluster()
    (router,) = by_kind(c, "router")
    for worker in by_kind(c, "worker"):
        url = urlsplit(worker.args["router-address"])
        service = c.service_for_host(url.hostname or "")
        assert service is not None, f"{worker.name}: {url.hostname} is no Service of deploy/kubernetes"
        assert url.port is not None
        assert c.endpoints(service, url.port, ready=set()) == [(router, router.worker_port())]


def test_ports_and_names_are_consistent() -> None:
    c = cluster()
    assert service_port_names_consistent(c) == []
    assert [problem for pod in c.pods for problem in flag_ports_consistent(pod)] == []


def test_no_liveness_probe_waits_on_another_pod() -> None:
    assert Simulation(cluster()).liveness_failures() == []
    docs = manifests()
    for doc in docs:
        if doc["kind"] == "Deployment" and doc["metadata"]["name"] == "sglang-slo-router":
            doc["spec"]["template"]["spec"]["containers"][0]["livenessProbe"] = {
                "httpGet": {"path": "/health", "port": "http"}
            }
    assert Simulation(cluster(docs)).liveness_failures() == ["sglang-slo-router-0"]  # restarted before workers join


def test_the_router_is_replaced_not_surged() -> None:
    """A surge router would wait for workers that stay connected to the old one."""
    (router,) = [d for d in manifests() if d["kind"] == "Deployment" and d["metadata"]["name"] == "sglang-slo-router"]
    assert router["spec"]["replicas"] == 1 and router["spec"]["strategy"]["type"] == "Recreate"


@pytest.mark.parametrize(
    ("src", "dst_kind", "port", "allowed"),
    [
        ("worker", "router", "workers", True),
        ("client", "router", "http", True),
        ("prometheus", "router", "http", True),
        ("client", "router", "workers", False),  # only workers join
        ("prometheus", "router", "workers", False),
        ("client", "worker", "http", False),  # no client reaches a worker
        ("router", "worker", "http", False),  # the router never calls a worker's HTTP port
        ("worker", "worker", "http", False),
        ("prometheus", "worker", "http", True),  # /metrics
    ],
)
def test_network_policies(src: str, dst_kind: str, port: str, allowed: bool) -> None:
    c = cluster()
    peers = {"client": CLIENT, "prometheus": PROMETHEUS, "router": by_kind(c, "router")[0].peer}
    peers["worker"] = by_kind(c, "worker")[0].peer
    dst = by_kind(c, dst_kind)[-1]
    number = dst.port(port)
    assert number is not None
    assert c.allowed(peers[src], dst, number) is allowed


def test_every_pod_may_resolve_services() -> None:
    c = cluster()
    for pod in c.pods:
        assert c.egress_allowed(pod.peer, DNS, 53, "UDP"), pod.name


def test_a_policy_that_blocks_the_worker_port_stops_the_model() -> None:
    """NetworkPolicy is part of the model: workers allowed out only to the router's HTTP port
    never join, so the router never becomes Ready."""
    docs = manifests()
    for doc in docs:
        if doc["kind"] == "NetworkPolicy" and doc["metadata"]["name"] == "sglang-slo-worker":
            doc["spec"]["egress"][0]["ports"] = [{"protocol": "TCP", "port": 30000}]
    c = cluster(docs)
    state = Simulation(c).run()
    assert not state.registered and not state.ready & set(named(c.pods, "router"))
    assert State() != state  # the workers themselves still became Ready
