"""Scheduler -> HTTP process status over ZMQ: the scheduler publishes a JSON snapshot every
few hundred ms; the HTTP process keeps the latest one for /slo/status and /metrics."""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson
import zmq


def default_address(port: int) -> str:
    return f"ipc://{tempfile.gettempdir()}/sglang-slo-status-{port}-{os.getpid()}.ipc"


def remove_ipc_file(address: str) -> None:
    """The bound ipc:// socket file outlives the scheduler; the launcher removes it at exit."""
    if address.startswith("ipc://"):
        try:
            os.unlink(address[len("ipc://") :])
        except FileNotFoundError:
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
