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

The cluster file's format: launch/launch_cluster_spec.py.
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
from pathlib import Path
from typing import Any

import requests

from launch_cluster_spec import ClusterConfigError, RouterSpec, WorkerSpec, load_cluster_spec
from router.worker_auth import SECRET_ENV
from server.process import ServerProcess, free_port

JOIN_TIMEOUT_S = 60.0  # workers are up; registering with the router takes a heartbeat or two
STOP_TIMEOUT_S = 10.0  # each process's drain on a stop, before SIGKILL (all stop at once)


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
