"""A small model of what a Kubernetes cluster does with deploy/kubernetes: the kubelet's probes,
Service endpoint selection and NetworkPolicy, together with what each of our processes needs
before it answers its probes. Run to a fixed point, it tells whether every pod becomes Ready or
whether two of them wait on each other.

What the cluster does (as the Kubernetes docs specify it):
- a pod is Ready when its readiness probe passes (after its startup probe, if any); a liveness
  probe that fails restarts the container;
- a Service's endpoints are the pods its selector matches that are Ready, or every running one
  with `publishNotReadyAddresses`; a `targetPort` by name resolves in each pod's container ports;
- NetworkPolicy: a pod selected by a policy of a type is isolated for that direction and admits
  only what one of its rules allows; traffic from the pod's own node (the kubelet's probes) is
  always allowed.

What our processes do (the dependencies, from router/ and server/):
- the router listens on `--port` (HTTP) and `--worker-bind` (ZMQ) from its start; its `/health`
  answers 200 only with at least one healthy worker registered;
- a worker's engine answers `/health` and `/health_generate` (a local one-token generation) once
  loaded, router or not; its agent waits for that `/health` (over loopback), then registers once
  the host of its `--router-address` names a Service that has an endpoint on that port leading
  to a router's worker port, and NetworkPolicy lets the connection through (the worker's egress
  and the router's ingress).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

NAMESPACE = "sglang-slo"  # the namespace the manifests are applied in (they name none)
DNS_SUFFIXES = ("", f".{NAMESPACE}", f".{NAMESPACE}.svc", f".{NAMESPACE}.svc.cluster.local")


@dataclass(frozen=True)
class Peer:
    """Anything that opens a connection: a pod of ours or one outside (a client, Prometheus)."""

    name: str
    namespace: str
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass
class Pod:
    """One replica of a Deployment's template, with the process its container runs."""

    peer: Peer
    deployment: str
    container: dict[str, Any]
    kind: str  # "router" | "worker"
    args: dict[str, str]

    @property
    def name(self) -> str:
        return self.peer.name

    @property
    def labels(self) -> dict[str, str]:
        return self.peer.labels

    def port(self, ref: int | str) -> int | None:
        """A container port by number or by name (None: no such named port)."""
        if isinstance(ref, int):
            return ref
        if ref.isdigit():
            return int(ref)
        for p in self.container.get("ports", []):
            if p.get("name") == ref:
                return int(p["containerPort"])
        return None

    def listens(self) -> set[int]:
        """The ports the process binds, from its own flags."""
        ports = {int(self.args.get("port", 30000))}
        if self.kind == "router":
            ports.add(self.worker_port())
        return ports

    def worker_port(self) -> int:
        bind = self.args.get("worker-bind")
        if bind:
            port = urlsplit(bind).port
            assert port is not None, f"{self.name}: --worker-bind {bind} names no port"
            return port
        return int(self.args.get("worker-port", int(self.args.get("port", 30000)) + 100))


def parse_args(args: Iterable[str]) -> dict[str, str]:
    """`--flag=value` and `--flag value` pairs (a bare flag maps to "")."""
    out: dict[str, str] = {}
    items = list(args)
    i = 0
    while i < len(items):
        item = items[i]
        assert item.startswith("--"), f"unexpected argument {item!r}"
        name, sep, value = item[2:].partition("=")
        if not sep and i + 1 < len(items) and not items[i + 1].startswith("--"):
            value = items[i + 1]
            i += 1
        out[name] = value
        i += 1
    return out


def _matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, or a Service's plain map); an empty one matches all."""
    if selector is None:
        return False
    assert "matchExpressions" not in selector, "the model reads matchLabels only"
    wanted = selector["matchLabels"] if "matchLabels" in selector else selector
    return all(labels.get(k) == v for k, v in wanted.items())


class Cluster:
    """The manifests' objects, with replica pods and the peers outside them."""

    def __init__(self, docs: Iterable[dict[str, Any]], namespaces: dict[str, dict[str, str]]) -> None:
        self.namespaces = {NAMESPACE: {}, **namespaces}
        self.pods: list[Pod] = []
        self.services: dict[str, dict[str, Any]] = {}
        self.policies: list[dict[str, Any]] = []
        for doc in docs:
            kind = doc["kind"]
            if kind == "Deployment":
                self._add_deployment(doc)
            elif kind == "Service":
                self.services[doc["metadata"]["name"]] = doc
            elif kind == "NetworkPolicy":
                self.policies.append(doc)

    def _add_deployment(self, doc: dict[str, Any]) -> None:
        template = doc["spec"]["template"]
        (container,) = template["spec"]["containers"]
        module = container["command"][-1]
        kind = {"launch_router": "router", "launch_server": "worker"}[module]
        for i in range(doc["spec"].get("replicas", 1)):
            name = f"{doc['metadata']['name']}-{i}"
            peer = Peer(name, NAMESPACE, dict(template["metadata"]["labels"]))
            args = parse_args(container.get("args", []))
            self.pods.append(Pod(peer, doc["metadata"]["name"], container, kind, args))

    def ns_labels(self, namespace: str) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": namespace, **self.namespaces.get(namespace, {})}

    # --- Services ---

    def service_for_host(self, host: str) -> dict[str, Any] | None:
        for name, svc in self.services.items():
            if host in {name + suffix for suffix in DNS_SUFFIXES}:
                return svc
        return None

    def endpoints(self, service: dict[str, Any], port: int, ready: set[str]) -> list[tuple[Pod, int]]:
        """(pod, target port) behind `service`'s `port`, as the endpoints controller selects them."""
        spec = service["spec"]
        (svc_port,) = [p for p in spec["ports"] if p["port"] == port] or [None]
        if svc_port is None:
            return []
        publish = spec.get("publishNotReadyAddresses", False)
        out = []
        for pod in self.pods:
            if not _matches(spec.get("selector"), pod.labels):
                continue
            if not (publish or pod.name in ready):
                continue
            target = pod.port(svc_port.get("targetPort", port))
            if target is not None:  # a named port the pod lacks: not an endpoint
                out.append((pod, target))
        return out

    # --- NetworkPolicy ---

    def _peer_matches(self, rule_peer: dict[str, Any], peer: Peer, policy_ns: str) -> bool:
        assert "ipBlock" not in rule_peer, "the model reads pod and namespace selectors only"
        ns_sel = rule_peer.get("namespaceSelector")
        pod_sel = rule_peer.get("podSelector")
        ns_ok = _matches(ns_sel, self.ns_labels(peer.namespace)) if ns_sel is not None else peer.namespace == policy_ns
        pod_ok = _matches(pod_sel, peer.labels) if pod_sel is not None else True
        return ns_ok and pod_ok

    @staticmethod
    def _port_matches(rule_ports: list[dict[str, Any]] | None, dst: Pod, port: int, protocol: str) -> bool:
        if not rule_ports:
            return True
        for p in rule_ports:
            if p.get("protocol", "TCP") != protocol:
                continue
            if "port" not in p or dst.port(p["port"]) == port:
                return True
        return False

    def _policies(self, pod: Peer, direction: str) -> list[dict[str, Any]]:
        out = []
        for policy in self.policies:
            ns = policy["metadata"].get("namespace", NAMESPACE)
            spec = policy["spec"]
            types = spec.get("policyTypes") or (["Ingress"] + (["Egress"] if "egress" in spec else []))
            if pod.namespace == ns and direction in types and _matches(spec["podSelector"], pod.labels):
                out.append(policy)
        return out

    def allowed(self, src: Peer, dst: Pod, port: int, protocol: str = "TCP") -> bool:
        """Whether NetworkPolicy lets `src` open a connection to `dst`:`port`."""
        ingress = self._policies(dst.peer, "Ingress")
        if ingress and not any(
            self._port_matches(rule.get("ports"), dst, port, protocol)
            and (
                not rule.get("from")  # empty or missing: every source
                or any(self._peer_matches(f, src, p["metadata"].get("namespace", NAMESPACE)) for f in rule["from"])
            )
            for p in ingress
            for rule in p["spec"].get("ingress", [])
        ):
            return False
        egress = self._policies(src, "Egress")
        return not egress or any(
            self._port_matches(rule.get("ports"), dst, port, protocol)
            and (
                not rule.get("to")
                or any(self._peer_matches(t, dst.peer, p["metadata"].get("namespace", NAMESPACE)) for t in rule["to"])
            )
            for p in egress
            for rule in p["spec"].get("egress", [])
        )

    def egress_allowed(self, src: Peer, dst: Peer, port: int, protocol: str) -> bool:
        """Egress alone, towards a peer outside the manifests (DNS)."""
        probe = Pod(dst, "", {"ports": []}, "other", {})
        egress = self._policies(src, "Egress")
        return not egress or any(
            self._port_matches(rule.get("ports"), probe, port, protocol)
            and (not rule.get("to") or any(self._peer_matches(t, dst, NAMESPACE) for t in rule["to"]))
            for p in egress
            for rule in p["spec"].get("egress", [])
        )


@dataclass
class State:
    ready: set[str] = field(default_factory=set)
    registered: set[str] = field(default_factory=set)  # workers joined to a router
    router_of: dict[str, str] = field(default_factory=dict)  # worker -> router pod


class Simulation:
    """The kubelet, the endpoints controller and our processes, stepped to a fixed point."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster

    def route_ok(self, pod: Pod, path: str, state: State) -> bool:
        """What our process answers on an HTTP path (the probes' view)."""
        if pod.kind == "worker":
            return path in ("/health", "/health_generate")  # local to its engine
        if path in ("/health", "/health_generate"):
            return any(state.router_of.get(w) == pod.name for w in state.registered)
        return False

    def probe_ok(self, pod: Pod, probe: dict[str, Any] | None, state: State) -> bool:
        """A kubelet probe, run from the pod's own node (no NetworkPolicy applies)."""
        if probe is None:
            return True
        if "tcpSocket" in probe:
            return pod.port(probe["tcpSocket"]["port"]) in pod.listens()
        get = probe["httpGet"]
        port = pod.port(get["port"])
        return port == int(pod.args.get("port", -1)) and self.route_ok(pod, get.get("path", "/"), state)

    def router_target(self, worker: Pod, state: State) -> Pod | None:
        """The router this worker's `--router-address` reaches now, if any."""
        address = worker.args.get("router-address")
        if not address:
            return None
        url = urlsplit(address)
        service = self.cluster.service_for_host(url.hostname or "")
        if service is None or url.port is None:
            return None
        for pod, target in self.cluster.endpoints(service, url.port, state.ready):
            if pod.kind == "router" and target == pod.worker_port() and self.cluster.allowed(worker.peer, pod, target):
                return pod
        return None

    def step(self, state: State) -> State:
        nxt = State(set(), set(state.registered), dict(state.router_of))
        for pod in self.cluster.pods:
            # the agent registers once its own engine answers /health (over loopback)
            if pod.kind == "worker" and pod.name not in nxt.registered and self.route_ok(pod, "/health", state):
                router = self.router_target(pod, state)
                if router is not None:
                    nxt.registered.add(pod.name)
                    nxt.router_of[pod.name] = router.name
        for pod in self.cluster.pods:
            c = pod.container
            if self.probe_ok(pod, c.get("startupProbe"), state) and self.probe_ok(pod, c.get("readinessProbe"), state):
                nxt.ready.add(pod.name)
        return nxt

    def run(self, max_steps: int = 100) -> State:
        state = State()
        for _ in range(max_steps):
            nxt = self.step(state)
            if nxt == state:
                return state
            state = nxt
        raise AssertionError("no fixed point: readiness oscillates")

    def liveness_failures(self) -> list[str]:
        """Pods whose liveness probe fails before anything else is up: the kubelet would restart
        them before their dependencies could ever be met."""
        return [p.name for p in self.cluster.pods if not self.probe_ok(p, p.container.get("livenessProbe"), State())]


def named(pods: Iterable[Pod], kind: str) -> list[str]:
    return sorted(p.name for p in pods if p.kind == kind)


def service_port_names_consistent(cluster: Cluster) -> list[str]:
    """Every Service port leads to a container port of some pod it selects: the mistakes a
    renamed port or a changed flag leave behind."""
    problems = []
    for name, svc in cluster.services.items():
        for port in svc["spec"]["ports"]:
            targets = {
                pod.port(port.get("targetPort", port["port"]))
                for pod in cluster.pods
                if _matches(svc["spec"].get("selector"), pod.labels)
            }
            if not targets or None in targets:
                problems.append(f"{name}:{port['port']} -> {port.get('targetPort')} names no container port")
    return problems


def flag_ports_consistent(pod: Pod) -> list[str]:
    """The named container ports are the ports the process binds (its flags)."""
    problems = []
    http = pod.port("http")
    if http != int(pod.args.get("port", -1)):
        problems.append(f"{pod.name}: container port http {http} != --port {pod.args.get('port')}")
    if pod.kind == "router" and pod.port("workers") != pod.worker_port():
        problems.append(f"{pod.name}: container port workers {pod.port('workers')} != --worker-bind's")
    return problems
