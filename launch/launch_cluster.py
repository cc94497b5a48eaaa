"""Start a router and several (emulated) workers on one machine from a small YAML file, until Ctrl-C.

    launch_cluster examples/cluster-h100-a40.yaml [--workers-file workers.json]

Each worker is a full `python -m launch_server` (its own SGLang scheduler, KV cache and SLO
policy) on 127.0.0.1, with `--emulate-gpu` (a GPU generation paced on the tiny model) or a real
model (`model_path`), so a pool of mixed GPU generations can be served and routed on a CPU
machine. With a `router` section, `python -m launch_router` fronts them and every worker joins
its pool over ZMQ; clients then talk to the router's URL only. Everything starts together and
is stopped by PID (process group) on Ctrl-C, SIGTERM or any start-up failure: all at once, each
given `STOP_TIMEOUT_S` to drain and end before it is killed (a second Ctrl-C or SIGTERM kills at
once); and every process watches this launcher, so none outlives it, even a SIGKILL of it.
`--workers-file` writes the running processes (name, gpu, url, pid) as JSON for a benchmark to
read. The router and its workers share a worker secret made for the run (or
$SGLANG_SLO_WORKER_SECRET when set).

YAML format:
    base_port: 31000            # optional; workers without `port` get consecutive ports from here
    args: [--slo-policy, slos]  # optional; flags every worker gets
    router:                     # optional; front the workers with one router
      port: 30000               # optional (default: a free port)
      worker_port: 30100        # optional; where workers connect (default: a free port)
      policy: goodserve         # optional --routing-policy
      params: {tau: 50}         # optional --routing-policy-param values
      args: [--dead-after-s, "2"]   # optional; the router's own flags
    workers:
      - gpu: h100               # --emulate-gpu value (h100, a100, a40 or a profile .json)
        model: llama3-8b        # optional --emulate-model
        count: 1                # optional; this many identical workers
        port: 31000             # optional (only with count 1)
        args: [--max-running-requests, "64"]   # optional; this worker's own flags
      - model_path: tiny        # a real model instead of an emulated GPU (tiny, default or a path)
      - gpu: h100
        role: prefill           # optional prefill|decode (default: co-located); needs a router and
                                # at least one worker of the other role
      - gpu: h100
        role: decode
        tier_ms: 50             # optional --worker-tier-ms: the TPOT tier it starts in (router only)
      - model_path: /models/llama-3-8b   # on a GPU machine: which cards a worker sees and its share
        gpu_ids: [0, 1]         # optional: CUDA_VISIBLE_DEVICES of the worker (with --tp-size 2 in args)
        mem_fraction: 0.85      # optional --mem-fraction-static; workers sharing a card must each set
        args: [--tp-size, "2"]  # it, together at most 0.95 of the card

A prefill worker gets `--disaggregation-mode prefill --disaggregation-bootstrap-port P`, with P
its HTTP port + 1000 (the next free one up when that is taken by a worker's HTTP port, the
router's ports or another prefill worker's bootstrap port; a free port at start when the worker
has no port); a decode worker gets `--disaggregation-mode decode`.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
import yaml

from router.worker_auth import SECRET_ENV
from server.emulation import DEFAULT_MODEL, resolve
from server.process import ServerProcess, free_port

TOP_KEYS = {"base_port", "args", "workers", "router"}
WORKER_KEYS = {"gpu", "model", "model_path", "count", "port", "args", "role", "tier_ms", "gpu_ids", "mem_fraction"}
SHARED_CARD_LIMIT = 0.95  # static memory shares of workers on one card, together (activations need the rest)
ROLES = ("prefill", "decode")  # PD disaggregation; no role = co-located prefill and decode
BOOTSTRAP_PORT_OFFSET = 1000  # a prefill worker's KV bootstrap port: its HTTP port + this (SGLang's default is
# one fixed port, 8998, which two prefill workers on one host would both want)
ROUTER_KEYS = {"port", "worker_port", "policy", "params", "args"}
JOIN_TIMEOUT_S = 60.0  # workers are up; registering with the router takes a heartbeat or two
STOP_TIMEOUT_S = 10.0  # each process's drain on a stop, before SIGKILL (all stop at once)


class ClusterConfigError(ValueError):
    """A bad cluster file; the message names the offending key."""


@dataclass
class WorkerSpec:
    name: str
    gpu: str | None  # emulated card; None for a real-model worker
    model: str  # emulated model, or the real model path
    port: int | None
    args: list[str] = field(default_factory=list)
    role: str | None = None  # "prefill" | "decode"; None = co-located
    tier_ms: float | None = None  # --worker-tier-ms: the TPOT tier it starts in
    bootstrap_port: int | None = None  # a prefill worker's KV bootstrap port (set before argv)
    gpu_ids: list[int] | None = None  # the cards it sees (CUDA_VISIBLE_DEVICES); None: all
    mem_fraction: float | None = None  # --mem-fraction-static: its share of each card's memory

    def env(self) -> dict[str, str]:
        """Environment on top of the launcher's: the cards this worker may use."""
        return {} if self.gpu_ids is None else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, self.gpu_ids))}

    def argv(self) -> list[str]:
        """launch_server flags; the worker's own `args` come last so they can override ours."""
        if self.gpu is None:
            out = ["--model-path", self.model]
        else:
            out = ["--emulate-gpu", self.gpu, "--emulate-model", self.model]
        if self.role == "prefill":
            if self.bootstrap_port is None:
                raise ValueError(f"{self.name}: a prefill worker needs its bootstrap port assigned first")
            out += ["--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        elif self.role == "decode":
            out += ["--disaggregation-mode", "decode"]
        if self.tier_ms is not None:
            out += ["--worker-tier-ms", f"{self.tier_ms:g}"]
        if self.mem_fraction is not None:
            out += ["--mem-fraction-static", f"{self.mem_fraction:g}"]
        return out + self.args


@dataclass
class RouterSpec:
    port: int | None = None
    worker_port: int | None = None
    policy: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)

    def argv(self, worker_port: int) -> list[str]:
        out = ["--worker-port", str(worker_port)]
        if self.policy is not None:
            out += ["--routing-policy", self.policy]
        for key, value in self.params.items():
            out += ["--routing-policy-param", f"{key}={json.dumps(value)}"]
        return out + self.args


@dataclass
class ClusterSpec:
    workers: list[WorkerSpec]
    router: RouterSpec | None = None


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ClusterConfigError(f"{where}: must be a list of flags")
    return [str(v) for v in value]


def parse_router(data: Any) -> RouterSpec:
    if not isinstance(data, dict):
        raise ClusterConfigError("router: must be a mapping")
    if unknown := set(data) - ROUTER_KEYS:
        raise ClusterConfigError(f"router: unknown key(s) {sorted(unknown)} (allowed: {sorted(ROUTER_KEYS)})")
    for key in ("port", "worker_port"):
        value = data.get(key)
        if value is not None and (not isinstance(value, int) or not 0 < value < 65536):
            raise ClusterConfigError(f"router.{key}: must be a port number")
    policy = data.get("policy")
    if policy is not None:
        from router.policies import ROUTING_POLICIES

        if policy not in ROUTING_POLICIES:
            raise ClusterConfigError(
                f"router.policy: unknown {policy!r} (known: {', '.join(sorted(ROUTING_POLICIES))})"
            )
    params = data.get("params", {})
    if not isinstance(params, dict):
        raise ClusterConfigError("router.params: must be a mapping of policy parameters")
    return RouterSpec(
        data.get("port"), data.get("worker_port"), policy, params, _str_list(data.get("args", []), "router.args")
    )


def parse_cluster_spec(data: Any) -> ClusterSpec:
    """The whole file: workers plus the optional router (whose ports no bootstrap port may take)."""
    router = None
    if isinstance(data, dict) and data.get("router") is not None:
        router = parse_router(data["router"])
    reserved = {p for p in (router.port, router.worker_port) if p is not None} if router else set()
    workers = parse_cluster(data, reserved)
    if router is None:
        for i, w in enumerate(data["workers"]):
            for key in ("role", "tier_ms"):
                if w.get(key) is not None:
                    raise ClusterConfigError(
                        f"workers[{i}].{key}: needs a router section (the router splits requests between "
                        "prefill and decode workers and assigns TPOT tiers)"
                    )
    return ClusterSpec(workers, router)


def parse_cluster(data: Any, reserved_ports: set[int] | frozenset[int] = frozenset()) -> list[WorkerSpec]:
    """The workers; `reserved_ports` (the router's) are kept clear of derived bootstrap ports."""
    if not isinstance(data, dict):
        raise ClusterConfigError("the cluster file must be a mapping with a 'workers' list")
    if unknown := set(data) - TOP_KEYS:
        raise ClusterConfigError(f"unknown key(s) {sorted(unknown)} (allowed: {sorted(TOP_KEYS)})")
    common = _str_list(data.get("args", []), "args")
    base_port = data.get("base_port")
    if base_port is not None and (not isinstance(base_port, int) or not 0 < base_port < 65536):
        raise ClusterConfigError("base_port: must be a port number")
    workers = data.get("workers")
    if not isinstance(workers, list) or not workers:
        raise ClusterConfigError("workers: must be a non-empty list")
    specs: list[WorkerSpec] = []
    for i, w in enumerate(workers):
        where = f"workers[{i}]"
        if not isinstance(w, dict):
            raise ClusterConfigError(f"{where}: must be a mapping")
        if unknown := set(w) - WORKER_KEYS:
            raise ClusterConfigError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: {sorted(WORKER_KEYS)})")
        gpu, model = _worker_model(w, where)
        count = w.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise ClusterConfigError(f"{where}.count: must be a positive integer")
        port = w.get("port")
        if port is not None and (count != 1 or not isinstance(port, int)):
            raise ClusterConfigError(f"{where}.port: an integer, and only with count 1")
        own = _str_list(w.get("args", []), f"{where}.args")
        role, tier_ms = _worker_role(w, where)
        gpu_ids, mem_fraction = _worker_cards(w, where, [*common, *own])
        for _ in range(count):
            name = f"{gpu or 'real'}-{f'{role}-' if role else ''}{len(specs)}"
            specs.append(
                WorkerSpec(
                    name, gpu, model, port, [*common, *own], role, tier_ms, gpu_ids=gpu_ids, mem_fraction=mem_fraction
                )
            )
    if base_port is not None:
        taken = {s.port for s in specs if s.port is not None}
        nxt = base_port
        for s in specs:
            if s.port is None:
                while nxt in taken:
                    nxt += 1
                s.port, nxt = nxt, nxt + 1
    ports = [s.port for s in specs if s.port is not None]
    if len(ports) != len(set(ports)):
        raise ClusterConfigError("workers: two workers share a port")
    _check_shared_cards(specs)
    roles = {s.role for s in specs}
    for role, other in (("decode", "prefill"), ("prefill", "decode")):
        if role in roles and other not in roles:
            raise ClusterConfigError(f"workers: {role} workers need at least one worker with role: {other}")
    _assign_bootstrap_ports(specs, set(ports) | set(reserved_ports))
    return specs


def _worker_role(w: dict[str, Any], where: str) -> tuple[str | None, float | None]:
    """(role, tier_ms) of one worker entry."""
    role = w.get("role")
    if role is not None and role not in ROLES:
        raise ClusterConfigError(f"{where}.role: must be prefill or decode (leave it out for co-located)")
    tier = w.get("tier_ms")
    if tier is not None:
        if isinstance(tier, bool) or not isinstance(tier, int | float) or not tier > 0:
            raise ClusterConfigError(f"{where}.tier_ms: must be a positive number of milliseconds")
        if role == "prefill":
            raise ClusterConfigError(f"{where}.tier_ms: not for a prefill worker (TPOT tiers are decode's)")
        tier = float(tier)
    return role, tier


def _flag_int(args: list[str], *flags: str) -> int:
    for i, arg in enumerate(args):
        for flag in flags:
            value = (
                args[i + 1]
                if arg == flag and i + 1 < len(args)
                else arg[len(flag) + 1 :]
                if arg.startswith(flag + "=")
                else None
            )
            if value is not None and value.isdigit():
                return int(value)
    return 1


def _worker_cards(w: dict[str, Any], where: str, args: list[str]) -> tuple[list[int] | None, float | None]:
    """(gpu_ids, mem_fraction) of one worker entry; its ranks (TP x DP x PP) must fit its cards."""
    gpu_ids = w.get("gpu_ids")
    if gpu_ids is not None:
        if (
            not isinstance(gpu_ids, list)
            or not gpu_ids
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpu_ids)
            or len(set(gpu_ids)) != len(gpu_ids)
        ):
            raise ClusterConfigError(f"{where}.gpu_ids: a non-empty list of distinct card indices, e.g. [0, 1]")
        ranks = (
            _flag_int(args, "--tp-size", "--tensor-parallel-size")
            * _flag_int(args, "--dp-size", "--data-parallel-size")
            * _flag_int(args, "--pp-size", "--pipeline-parallel-size")
        )
        if ranks > len(gpu_ids):
            raise ClusterConfigError(f"{where}.gpu_ids: its {ranks} ranks (TP x DP x PP) need {ranks} cards")
    fraction = w.get("mem_fraction")
    if fraction is not None and (
        isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction < 1
    ):
        raise ClusterConfigError(f"{where}.mem_fraction: a share of each card's memory, between 0 and 1")
    return gpu_ids, None if fraction is None else float(fraction)


def _check_shared_cards(specs: list[WorkerSpec]) -> None:
    """Workers on one card must each say their share, and the shares must leave room to run."""
    on_card: dict[int, list[WorkerSpec]] = {}
    for s in specs:
        for card in s.gpu_ids or ():
            on_card.setdefault(card, []).append(s)
    for card, sharing in sorted(on_card.items()):
        if len(sharing) < 2:
            continue
        names = ", ".join(s.name for s in sharing)
        if any(s.mem_fraction is None for s in sharing):
            raise ClusterConfigError(f"workers: {names} share card {card}: each needs mem_fraction")
        total = sum(s.mem_fraction or 0.0 for s in sharing)
        if total > SHARED_CARD_LIMIT:
            raise ClusterConfigError(
                f"workers: {names} share card {card} with mem_fraction {total:g} in all (at most {SHARED_CARD_LIMIT})"
            )


def _assign_bootstrap_ports(specs: list[WorkerSpec], taken: set[int]) -> None:
    """Prefill workers with an HTTP port get port + BOOTSTRAP_PORT_OFFSET, or the next one up that
    no worker, router or earlier prefill worker uses; the rest get a free port at start (Cluster)."""
    taken = set(taken)
    for s in specs:
        if s.role != "prefill" or s.port is None:
            continue
        candidate = s.port + BOOTSTRAP_PORT_OFFSET
        while candidate in taken:
            candidate += 1
        if candidate < 65536:
            s.bootstrap_port = candidate
            taken.add(candidate)


def _worker_model(w: dict[str, Any], where: str) -> tuple[str | None, str]:
    """(emulated gpu, model) of an emulated worker, or (None, model path) of a real-model one."""
    if "model_path" in w:
        if not isinstance(w["model_path"], str) or "gpu" in w or "model" in w:
            raise ClusterConfigError(f"{where}.model_path: a string, and not with gpu/model (it runs the real model)")
        return None, w["model_path"]
    if not isinstance(w.get("gpu"), str):
        raise ClusterConfigError(f"{where}.gpu: required (e.g. h100), or model_path for a real model")
    model = w.get("model", DEFAULT_MODEL)
    try:
        resolve(w["gpu"], model)
    except ValueError as e:
        raise ClusterConfigError(f"{where}.gpu: {e}") from None
    return w["gpu"], model


def _read(path: str | Path) -> Any:
    try:
        return yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ClusterConfigError(f"cannot read {path}: {e}") from None


def load_cluster(path: str | Path) -> list[WorkerSpec]:
    return parse_cluster(_read(path))


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    return parse_cluster_spec(_read(path))


def _free_port(taken: set[int]) -> int:
    """A port free now and not already promised to another process of this cluster."""
    while True:
        port = free_port()
        if port not in taken:
            return port


class Cluster:
    """The started processes; a context manager that always stops every one of them by PID."""

    def __init__(self, specs: list[WorkerSpec], router: RouterSpec | None = None, api_key: str | None = None) -> None:
        self.specs = specs
        self.api_key = api_key
        self.admin_key = secrets.token_hex(32)
        # the router's and workers' own credential, never a client's (router/worker_auth.py)
        self.env = {**os.environ, SECRET_ENV: os.environ.get(SECRET_ENV) or secrets.token_hex(32)}
        key = ["--api-key", api_key] if api_key else []
        self.router: ServerProcess | None = None
        self.worker_port: int | None = None
        joins: list[str] = []
        # Every port is fixed here, not by ServerProcess, so none can be handed out twice: a
        # free port for one process is not yet bound when the next one is picked.
        promised = {p for s in specs for p in (s.port, s.bootstrap_port) if p is not None}
        if router is not None:
            self.worker_port = router.worker_port or _free_port(promised)
            promised.add(self.worker_port)
            self.router = self._router_process(router, router.port or _free_port(promised))
            promised.add(self.router.port)
            joins = ["--router-address", f"tcp://127.0.0.1:{self.worker_port}"]
        ports: list[int] = []
        for s in specs:
            port = s.port if s.port is not None else _free_port(promised)
            promised.add(port)
            ports.append(port)
        for s in specs:
            if s.role == "prefill" and s.bootstrap_port is None:
                s.bootstrap_port = _free_port(promised)
                promised.add(s.bootstrap_port)
        self.servers = [
            ServerProcess(
                *s.argv(), *key, *joins, *(["--worker-id", s.name] if joins else []),
                name=s.name, port=port, env={**self.env, **s.env()},
            )
            for s, port in zip(specs, ports, strict=True)
        ]  # fmt: skip

    def _router_process(self, router: RouterSpec, port: int | None) -> ServerProcess:
        assert self.worker_port is not None
        key = ["--api-key", self.api_key] if self.api_key else []
        # The client key is no operator key: the launcher reads /slo/status with an admin key of this run.
        # Without --api-key the router is open, whatever keys this shell's environment holds.
        keys = ("SGLANG_SLO_API_KEY", "SGLANG_SLO_ADMIN_API_KEY")
        env = {k: v for k, v in self.env.items() if k not in keys}
        if self.api_key:
            env["SGLANG_SLO_ADMIN_API_KEY"] = self.admin_key
        return ServerProcess(
            *router.argv(self.worker_port), *key, name="router", module="launch_router", port=port,
            ready_path="/slo/status", api_key=self.admin_key if self.api_key else None, env=env,
        )  # fmt: skip

    def restart_router(self, router: RouterSpec) -> None:
        """Swap the router (e.g. for another policy) and keep the workers: they re-register with
        the new one on the same worker port by themselves. Same client port unless `router.port`."""
        if self.router is None or self.worker_port is None:
            raise RuntimeError("this cluster was started without a router")
        if router.worker_port not in (None, self.worker_port):
            raise ValueError(f"the workers connect to port {self.worker_port}, not {router.worker_port}")
        port = router.port or self.router.port
        self.router.stop()
        self.router = self._router_process(router, port)
        self.router.start()
        self.wait_joined()

    @property
    def url(self) -> str:
        """Where clients go: the router if there is one, else the first worker."""
        return (self.router or self.servers[0]).url

    def start(self) -> Cluster:
        try:
            if self.router is not None:
                self.router.start()
            with ThreadPoolExecutor(len(self.servers)) as pool:
                list(pool.map(lambda srv: srv.start(), self.servers))
            if self.router is not None:
                self.wait_joined()
        except BaseException:
            self.stop()
            raise
        return self

    def wait_joined(self, timeout: float = JOIN_TIMEOUT_S) -> None:
        """Until the router counts every worker as healthy."""
        assert self.router is not None
        want = {s.name for s in self.specs}
        deadline = time.monotonic() + timeout
        while True:
            status = requests.get(self.router.url + "/slo/status", headers=self.router.headers, timeout=5).json()
            healthy = {w["worker_id"] for w in status.get("workers", []) if w.get("healthy")}
            if want <= healthy:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers {sorted(want - healthy)} did not join the router in {timeout:g} s")
            time.sleep(0.25)

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Every process at once: SIGTERM to each (workers drain), SIGKILL after `timeout_s`."""
        every = [*self.servers, *([self.router] if self.router is not None else [])]
        with ThreadPoolExecutor(len(every)) as pool:
            list(pool.map(lambda srv: srv.stop(timeout_s, graceful=srv is not self.router), every))

    def kill(self) -> None:
        """At once, no drain."""
        for srv in [*self.servers, *([self.router] if self.router is not None else [])]:
            srv.stop(0.0)

    def describe(self) -> list[dict[str, Any]]:
        out = [
            {
                "name": s.name,
                "gpu": s.gpu or "cpu",
                "model": s.model,
                "role": s.role,
                "tier_ms": s.tier_ms,
                "bootstrap_port": s.bootstrap_port,
                "gpu_ids": s.gpu_ids,
                "url": srv.url,
                "pid": srv.proc.pid if srv.proc else None,
            }
            for s, srv in zip(self.specs, self.servers, strict=True)
        ]
        if self.router is not None:
            pid = self.router.proc.pid if self.router.proc else None
            out.insert(0, {"name": "router", "gpu": None, "model": None, "url": self.router.url, "pid": pid})
        return out

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def describe_line(process: dict[str, Any]) -> str:
    """One console line per started process (the router has no GPU or model of its own)."""
    kind = "router" if process["gpu"] is None else f"{process['gpu']}/{process['model']}"
    return f"{process['name']:10} {kind:20} {process['url']}  (pid {process['pid']})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="launch_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="cluster YAML file")
    parser.add_argument("--workers-file", type=Path, help="write the running workers here (JSON)")
    parser.add_argument("--api-key", help="required by the router and every worker (and presented between them)")
    args = parser.parse_args(argv)
    try:
        spec = load_cluster_spec(args.config)
    except ClusterConfigError as e:
        raise SystemExit(f"{args.config}: {e}") from None
    specs = spec.workers
    stop = threading.Event()

    def on_signal(*_: object) -> None:
        if stop.is_set():  # a second signal: no more waiting
            raise SystemExit(1)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    print(f"launch_cluster: starting {len(specs)} workers ...", flush=True)
    try:
        with Cluster(specs, spec.router, args.api_key) as cluster:
            workers = cluster.describe()
            for w in workers:
                print(f"  {describe_line(w)}", flush=True)
            if args.workers_file:
                args.workers_file.write_text(json.dumps(workers, indent=2))
            print(f"ready: clients use {cluster.url}; Ctrl-C stops every process", flush=True)
            stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if args.workers_file and args.workers_file.exists():
            args.workers_file.unlink()
    print("launch_cluster: all workers stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
