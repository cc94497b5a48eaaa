"""The cluster file of launch_cluster: its format, and its parsing into worker and router specs
that are checked before anything starts (a bad key stops start-up naming it).

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

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from server.emulation import DEFAULT_MODEL, resolve

TOP_KEYS = {"base_port", "args", "workers", "router"}
WORKER_KEYS = {"gpu", "model", "model_path", "count", "port", "args", "role", "tier_ms", "gpu_ids", "mem_fraction"}
SHARED_CARD_LIMIT = 0.95  # static memory shares of workers on one card, together (activations need the rest)
ROLES = ("prefill", "decode")  # PD disaggregation; no role = co-located prefill and decode
BOOTSTRAP_PORT_OFFSET = 1000  # a prefill worker's KV bootstrap port: its HTTP port + this (SGLang's default is
# one fixed port, 8998, which two prefill workers on one host would both want)
ROUTER_KEYS = {"port", "worker_port", "policy", "params", "args"}


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
