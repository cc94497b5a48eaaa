"""Scheduler -> HTTP process status over ZMQ: the scheduler publishes a JSON snapshot every
few hundred ms; the HTTP process keeps the latest one for /slo/status and /metrics.

Under data parallelism each replica's leading scheduler publishes on its own address (replica 0
on the base address) and the HTTP process merges the replicas into one engine status."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import zmq

PRIVATE_DIR_PREFIX = "sglang-slo-"


def default_address(port: int) -> str:
    """A socket in a fresh directory only this user can enter (mkdtemp: random name, mode 0700).
    A fixed path in the shared temp directory let another local user bind it first and feed the
    HTTP process a false status, or connect and read every snapshot. The scheduler process
    learns the address from the launcher's config (SloServerConfig.to_env)."""
    directory = tempfile.mkdtemp(prefix=PRIVATE_DIR_PREFIX)
    return f"ipc://{directory}/status-{port}.ipc"


def dp_status_address(base: str, dp_index: int) -> str:
    """Replica `dp_index`'s address: two replicas binding one address would fail to start."""
    return base if dp_index == 0 else f"{base}.dp{dp_index}"


# Counts a data-parallel engine has as the sum of its replicas'; every other field is replica 0's
# (the replicas run the same policy and model, each at its own pace).
ADDITIVE_FIELDS = (
    "waiting",
    "running",
    "max_running_requests",
    "kv_capacity_tokens",
    "kv_used_tokens",
    "dropped_in_queue",
    "prefill_deferred",
    "prefill_alone",
    "preempted",
    "best_effort_waiting",
    "held_waiting",
    "lost_held_passes",
    "plan_errors",
    "fallbacks",
    "budget_fallbacks",
    "planned_passes",
)


def merge_replicas(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """One engine status from the replicas' latest snapshots (those heard from so far)."""
    heard = [s for s in snapshots if s]
    if len(snapshots) <= 1 or not heard:
        return dict(heard[0]) if heard else {}
    merged = dict(heard[0])
    for name in ADDITIVE_FIELDS:
        values = [s.get(name) for s in heard]
        merged[name] = sum(values) if all(isinstance(v, int) for v in values) else None  # None: unknown
    merged["data_parallel"] = {"replicas": len(snapshots), "reporting": len(heard)}
    return merged


def remove_ipc_file(address: str) -> None:
    """The bound ipc:// socket file outlives the scheduler; the launcher removes it at exit, and
    its private directory with the last of its sockets."""
    if not address.startswith("ipc://"):
        return
    path = address[len("ipc://") :]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    directory = os.path.dirname(path)
    if os.path.basename(directory).startswith(PRIVATE_DIR_PREFIX):
        try:
            os.rmdir(directory)
        except OSError:  # other replicas' sockets still there, or already gone
            pass


class StatusPublisher:
    """Runs a daemon thread in the scheduler process that publishes `snapshot()`."""

    def __init__(self, address: str, snapshot: Callable[[], dict[str, Any]], interval_s: float) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.PUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self._snapshot = snapshot
        self._interval = interval_s
        threading.Thread(target=self._run, name="slo-status", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self._sock.send(orjson.dumps(self._snapshot()), zmq.NOBLOCK)
            except zmq.Again:
                pass
            except Exception:  # noqa: BLE001 - a status glitch must never kill the scheduler
                pass
            time.sleep(self._interval)


class StatusSubscriber:
    """Keeps the latest snapshot; a background thread drains the SUB socket."""

    def __init__(self, address: str) -> None:
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.CONFLATE, 1)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(address)
        self.latest: dict[str, Any] = {}
        self.received_at: float | None = None
        threading.Thread(target=self._run, name="slo-status-sub", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                self.latest = orjson.loads(self._sock.recv())
                self.received_at = time.time()
            except Exception:  # noqa: BLE001
                time.sleep(0.1)


class ReplicaStatus:
    """The latest status of every data-parallel replica, merged (`latest`)."""

    def __init__(self, base: str, replicas: int = 1) -> None:
        self.addresses = [dp_status_address(base, i) for i in range(max(1, replicas))]
        self._subscribers = [StatusSubscriber(address) for address in self.addresses]

    @property
    def latest(self) -> dict[str, Any]:
        return merge_replicas([s.latest for s in self._subscribers])
