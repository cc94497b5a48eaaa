"""ServerProcess starts a server again on a fresh port when its port was taken before it bound."""

from __future__ import annotations

import socket
from pathlib import Path

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
