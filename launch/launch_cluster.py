"""Start several (emulated) workers on one machine from a small YAML file, until Ctrl-C.

    launch_cluster examples/cluster-h100-a40.yaml [--workers-file workers.json]

Each worker is a full `python -m launch_server` (its own SGLang scheduler, KV cache and SLO
policy) on 127.0.0.1, usually with `--emulate-gpu`, so a pool of mixed GPU generations can be
served and routed on a CPU machine. Workers start together and are stopped by PID (process
group) on Ctrl-C, SIGTERM or any start-up failure. `--workers-file` writes the running workers
(name, gpu, url, pid) as JSON for a router or a benchmark to read.

YAML format:
    base_port: 31000            # optional; workers without `port` get consecutive ports from here
    args: [--slo-policy, slos]  # optional; flags every worker gets
    workers:
      - gpu: h100               # --emulate-gpu value (h100, a100, a40 or a profile .json)
        model: llama3-8b        # optional --emulate-model
        count: 1                # optional; this many identical workers
        port: 31000             # optional (only with count 1)
        args: [--max-running-requests, "64"]   # optional; this worker's own flags
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from server.emulation import DEFAULT_MODEL, resolve
from server.process import ServerProcess

TOP_KEYS = {"base_port", "args", "workers"}
WORKER_KEYS = {"gpu", "model", "count", "port", "args"}


class ClusterConfigError(ValueError):
    """A bad cluster file; the message names the offending key."""


@dataclass
class WorkerSpec:
    name: str
    gpu: str
    model: str
    port: int | None
    args: list[str] = field(default_factory=list)

    def argv(self) -> list[str]:
        return ["--emulate-gpu", self.gpu, "--emulate-model", self.model, *self.args]


def _str_list(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str | int | float) for v in value):
        raise ClusterConfigError(f"{where}: must be a list of flags")
    return [str(v) for v in value]


def parse_cluster(data: Any) -> list[WorkerSpec]:
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
        if not isinstance(w.get("gpu"), str):
            raise ClusterConfigError(f"{where}.gpu: required, e.g. h100")
        model = w.get("model", DEFAULT_MODEL)
        try:
            resolve(w["gpu"], model)
        except ValueError as e:
            raise ClusterConfigError(f"{where}.gpu: {e}") from None
        count = w.get("count", 1)
        if not isinstance(count, int) or count < 1:
            raise ClusterConfigError(f"{where}.count: must be a positive integer")
        port = w.get("port")
        if port is not None and (count != 1 or not isinstance(port, int)):
            raise ClusterConfigError(f"{where}.port: an integer, and only with count 1")
        own = _str_list(w.get("args", []), f"{where}.args")
        for _ in range(count):
            specs.append(WorkerSpec(f"{w['gpu']}-{len(specs)}", w["gpu"], model, port, [*common, *own]))
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
    return specs


def load_cluster(path: str | Path) -> list[WorkerSpec]:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ClusterConfigError(f"cannot read {path}: {e}") from None
    return parse_cluster(data)


class Cluster:
    """The started workers; a context manager that always stops every one of them by PID."""

    def __init__(self, specs: list[WorkerSpec]) -> None:
        self.specs = specs
        self.servers = [ServerProcess(*s.argv(), name=s.name, port=s.port) for s in specs]

    def start(self) -> Cluster:
        try:
            with ThreadPoolExecutor(len(self.servers)) as pool:
                list(pool.map(lambda srv: srv.start(), self.servers))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for server in self.servers:
            server.stop()

    def describe(self) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "gpu": s.gpu, "model": s.model, "url": srv.url, "pid": srv.proc.pid if srv.proc else None}
            for s, srv in zip(self.specs, self.servers, strict=True)
        ]

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="launch_cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", help="cluster YAML file")
    parser.add_argument("--workers-file", type=Path, help="write the running workers here (JSON)")
    args = parser.parse_args(argv)
    try:
        specs = load_cluster(args.config)
    except ClusterConfigError as e:
        raise SystemExit(f"{args.config}: {e}") from None
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    print(f"launch_cluster: starting {len(specs)} workers ...", flush=True)
    try:
        with Cluster(specs) as cluster:
            workers = cluster.describe()
            for w in workers:
                print(f"  {w['name']:10} {w['gpu']}/{w['model']:12} {w['url']}  (pid {w['pid']})", flush=True)
            if args.workers_file:
                args.workers_file.write_text(json.dumps(workers, indent=2))
            print("ready; Ctrl-C stops every worker", flush=True)
            stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        if args.workers_file and args.workers_file.exists():
            args.workers_file.unlink()
    print("launch_cluster: all workers stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
