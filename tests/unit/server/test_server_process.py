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
import pytest
import requests

from server.process import ServerProcess, taken_port

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


def test_a_start_that_found_its_rendezvous_port_taken_is_tried_again(tmp_path: Path) -> None:
    """SGLang's scheduler binds a port it picked itself; taken meanwhile, the server exits, and a
    second start (which picks anew) comes up on the same HTTP port."""
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        env = {**os.environ, "RENDEZVOUS_FIRST_PORT": str(taken), "RENDEZVOUS_MARKER": str(tmp_path / "started")}
        server = ServerProcess(module="tests.unit.server._rendezvous_server", cwd=ROOT, env=env, name="rendezvous")
        port = server.port
        try:
            server.start()
            assert server.port == port
            assert requests.get(server.url + "/health", timeout=5).status_code == 200
            log = server.log_path.read_text()
            assert "EADDRINUSE" in log and f"port: {taken}," in log and "rendezvous on port" in log
        finally:
            server.stop()


def test_a_rendezvous_port_the_caller_named_is_not_tried_again(tmp_path: Path) -> None:
    """Taken, it would be taken again: the start fails at once, naming it."""
    with socket.socket() as squatter:
        squatter.bind(("0.0.0.0", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        env = {**os.environ, "RENDEZVOUS_FIRST_PORT": str(taken), "RENDEZVOUS_MARKER": str(tmp_path / "started")}
        server = ServerProcess(
            "--rendezvous-port", str(taken), module="tests.unit.server._rendezvous_server", cwd=ROOT, env=env
        )
        try:
            with pytest.raises(RuntimeError, match=f"port: {taken},"):
                server.start()
            assert server.log_path.read_text().count("EADDRINUSE") == 1
        finally:
            server.stop()


def test_the_taken_port_is_read_from_uvicorns_and_torchs_messages() -> None:
    assert taken_port("x port: 23456, useIpv6: false, code: -98, name: EADDRINUSE, message: ...") == 23456
    assert taken_port("bind on address ('127.0.0.1', 18555): address already in use") == 18555
    assert taken_port("Address already in use (addr='tcp://127.0.0.1:4000')") is None


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
