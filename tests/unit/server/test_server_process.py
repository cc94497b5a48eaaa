"""ServerProcess starts a server again on a fresh port when its port was taken before it bound,
and what it starts never outlives the process that started it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import requests

from server.process import ServerProcess

ROOT = Path(__file__).resolve().parents[3]


def test_a_taken_port_is_replaced_by_a_free_one() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = ServerProcess(module="tests.unit.server._health_server", port=taken, cwd=ROOT, name="health")
        try:
            server.start()
            assert server.port != taken and server.url.endswith(f":{server.port}")
            assert requests.get(server.url + "/health", timeout=5).status_code == 200
        finally:
            server.stop()
    assert server.proc is None


def test_a_child_never_outlives_its_launcher_even_a_sigkilled_one() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.server._orphan_parent"], cwd=ROOT, env=env, stdout=subprocess.PIPE
    )
    try:
        assert launcher.stdout is not None
        child = psutil.Process(int(launcher.stdout.readline()))
        family = [child, *child.children(recursive=True)]
        assert len(family) == 2 and all(p.is_running() for p in family)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(5)
        gone, alive = psutil.wait_procs(family, timeout=5)
        assert not alive, f"outlived the launcher: {alive}"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def test_free_ports_lie_outside_the_ephemeral_range() -> None:
    """A reconnecting client is never handed one of them as its own local port (TCP self-connect)."""
    from server.process import _ephemeral_range, free_port

    low, high = _ephemeral_range()
    ports = {free_port() for _ in range(20)}
    assert all(not low <= p <= high for p in ports), ports
