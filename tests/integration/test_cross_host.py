"""Two hosts on one machine: Linux network namespaces joined by a veth pair, created and removed
here. Host A runs the router and a PD decode worker, host B a PD prefill worker; nothing between
them is loopback. Proven end to end, on the tiny model:

- the non-loopback path: B's worker joins A's router over CurveZMQ and serves through it;
- advertised addresses: B's worker binds every interface and advertises nothing, so the router
  reaches it at the address its connection comes from; A's worker advertises its own;
- PD bootstrap: the decode worker on A fetches the KV cache from the prefill worker on B, at the
  address the router learnt, and the pair's tokens equal a co-located server's;
- encryption: a packet capture on B's side of the link sees the router's traffic, and none of it
  in the clear (the request's fields never appear).

Skipped, saying why, where namespaces cannot be created (not root, no `ip`, a locked-down kernel).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import zmq.auth

from server.models import ensure_tiny_model
from server.process import ServerProcess, free_port

pytest.importorskip("mooncake.engine", reason="the Mooncake transfer engine is installed by ./slo setup")

CLONE_NEWNET = 0x40000000
SUBNET = "10.231.{}.{}"
ROUTER_HTTP, ROUTER_WORKERS = 30000, 30100
PROMPTS = [[5 + (i * 7 + j) % 500 for i in range(24 + 8 * j)] for j in range(3)]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


class Netns:
    """A named network namespace whose calls (and the processes they start) happen inside it."""

    _libc = ctypes.CDLL(None, use_errno=True)

    def __init__(self, name: str) -> None:
        self.name = name
        self.path = f"/run/netns/{name}"

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """This thread in the namespace; processes it starts are born there."""
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(self.path, os.O_RDONLY)
        try:
            self._setns(target)
            try:
                yield
            finally:
                self._setns(home)
        finally:
            os.close(target)
            os.close(home)

    def _setns(self, fd: int) -> None:
        if self._libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {self.name}")


@dataclass(frozen=True)
class Hosts:
    a: Netns
    b: Netns
    addr_a: str
    addr_b: str
    link_b: str  # B's end of the veth pair


@pytest.fixture(scope="module")
def hosts() -> Iterator[Hosts]:
    """Namespaces A and B with a veth pair between them."""
    if shutil.which("ip") is None:
        pytest.skip("cross-host test: no `ip` command (iproute2) to create network namespaces")
    tag = uuid.uuid4().hex[:6]
    a, b = Netns(f"slo-a-{tag}"), Netns(f"slo-b-{tag}")
    octet = int(tag[:2], 16) % 200 + 20
    addr_a, addr_b = SUBNET.format(octet, 1), SUBNET.format(octet, 2)
    veth_a, veth_b = f"sloa{tag}", f"slob{tag}"
    try:
        _ip("netns", "add", a.name)
    except (subprocess.CalledProcessError, OSError) as exc:
        reason = getattr(exc, "stderr", None) or exc
        pytest.skip(f"cross-host test: cannot create a network namespace here ({str(reason).strip()}); needs root")
    try:
        _ip("netns", "add", b.name)
        _ip("link", "add", veth_a, "type", "veth", "peer", "name", veth_b)
        _ip("link", "set", veth_a, "netns", a.name)
        _ip("link", "set", veth_b, "netns", b.name)
        for ns, dev, addr in ((a, veth_a, addr_a), (b, veth_b, addr_b)):
            _ip("-n", ns.name, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns.name, "link", "set", dev, "up")
            _ip("-n", ns.name, "link", "set", "lo", "up")
        yield Hosts(a, b, addr_a, addr_b, veth_b)
    finally:
        for ns in (a, b):
            with contextlib.suppress(subprocess.CalledProcessError, OSError):
                _ip("netns", "del", ns.name)  # takes its end of the veth pair with it


class HostServer(ServerProcess):
    """A server on every interface of its host (ServerProcess binds loopback only); started,
    polled and stopped from inside the host's namespace."""

    def __init__(self, ns: Netns, *args: str, **kwargs: object) -> None:
        self.ns = ns
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _set_port(self, port: int) -> None:
        self.port = port
        self.args = [*self.base_args, "--host", "0.0.0.0", "--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> HostServer:
        with self.ns.entered():
            super().start()
        return self

    def stop(self) -> None:
        with self.ns.entered():
            super().stop()

    def get(self, path: str) -> dict:
        with self.ns.entered():
            return requests.get(self.url + path, timeout=10).json()

    def generate(self, ids: list[int], n: int) -> dict:
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
        with self.ns.entered():
            resp = requests.post(self.url + "/generate", json=body, timeout=300)
        assert resp.status_code == 200, resp.text
        return resp.json()


class Capture:
    """Every TCP payload to or from `port` on one interface of a namespace (AF_PACKET)."""

    def __init__(self, ns: Netns, device: str, port: int) -> None:
        with ns.entered():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(0x0003))
            self.sock.bind((device, 0))
        self.sock.settimeout(0.2)
        self.port = port
        self.payload = bytearray()
        self.packets = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                frame = self.sock.recv(65535)
            except TimeoutError:
                continue
            if len(frame) < 34 or frame[12:14] != b"\x08\x00" or frame[23] != 6:  # IPv4, TCP
                continue
            ihl = (frame[14] & 0x0F) * 4
            tcp = 14 + ihl
            sport, dport = struct.unpack("!HH", frame[tcp : tcp + 4])
            if self.port in (sport, dport):
                data = frame[tcp + (frame[tcp + 12] >> 4) * 4 :]
                self.payload += data
                self.packets += 1

    def stop(self) -> bytes:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
        return bytes(self.payload)


@pytest.fixture(scope="module")
def pool(hosts: Hosts, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    a, b, addr_a, addr_b = hosts.a, hosts.b, hosts.addr_a, hosts.addr_b
    keys = tmp_path_factory.mktemp("curve")
    zmq.auth.create_certificates(str(keys), "router")
    router_addr = f"tcp://{addr_a}:{ROUTER_WORKERS}"
    capture = Capture(b, hosts.link_b, ROUTER_WORKERS)
    # Workers off the router's machine must prove a secret of their own (never the client key).
    env = {**os.environ, "SGLANG_SLO_WORKER_SECRET": secrets.token_hex(24)}
    router = HostServer(
        a, "--worker-bind", f"tcp://0.0.0.0:{ROUTER_WORKERS}", "--allow-remote-workers",
        "--curve-secret-key", str(keys / "router.key_secret"), "--tokenizer-path", str(ensure_tiny_model()),
        "--routing-policy", "polyserve", "--dead-after-s", "3",
        name="router-xhost", module="launch_router", port=ROUTER_HTTP, ready_path="/slo/status", env=env,
    )  # fmt: skip
    joining = [
        "--router-address",
        router_addr,
        "--router-allow-remote",
        "--router-curve-public-key",
        str(keys / "router.key"),
    ]
    prefill = HostServer(
        b,
        "--model-path",
        "tiny",
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-bootstrap-port",
        str(free_port()),
        *joining,
        "--worker-id",
        "prefill-b",
        "--slo-policy",
        "edf",
        name="prefill-b",
        env=env,
    )  # fmt: skip  (no --advertise-host: the router sees where it connects from)
    decode = HostServer(
        a, "--model-path", "tiny", "--disaggregation-mode", "decode", *joining, "--advertise-host", addr_a,
        "--worker-id", "decode-a", "--slo-policy", "edf", name="decode-a", env=env,
    )  # fmt: skip
    try:
        router.start()
        with ThreadPoolExecutor(2) as pool:  # each start enters its own host's namespace, in its thread
            list(pool.map(lambda s: s.start(), (prefill, decode)))
        deadline = time.monotonic() + 90
        while {w["worker_id"] for w in router.get("/slo/status")["workers"] if w["healthy"]} != {
            "prefill-b",
            "decode-a",
        }:
            assert time.monotonic() < deadline, router.get("/slo/status")["workers"]
            time.sleep(0.5)
        yield {"router": router, "prefill": prefill, "decode": decode, "capture": capture, "a": addr_a, "b": addr_b}
    finally:
        for server in (decode, prefill, router):  # a server that never started has nothing to stop
            server.stop()
        capture.stop()


def test_workers_are_reached_where_they_are(pool: dict) -> None:
    status = pool["router"].get("/slo/status")
    urls = {w["worker_id"]: w["http_url"] for w in status["workers"]}
    assert urls["prefill-b"] == f"http://{pool['b']}:{pool['prefill'].port}"  # the address it connected from
    assert urls["decode-a"] == f"http://{pool['a']}:{pool['decode'].port}"  # its --advertise-host
    assert status["worker_link_encrypted"] is True


def test_a_cross_host_pd_pair_returns_a_co_located_servers_tokens(pool: dict, tiny_server: ServerProcess) -> None:
    for ids in PROMPTS:
        reference = requests.post(
            tiny_server.url + "/generate",
            json={"input_ids": ids, "sampling_params": {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}},
            timeout=300,
        ).json()["output_ids"]
        out = pool["router"].generate(ids, 12)
        assert out["output_ids"] == reference  # the KV crossed from B to A through the bootstrap host
        assert out["meta_info"]["prefill_workers"] == ["prefill-b"] and out["meta_info"]["workers"] == ["decode-a"]
    assert pool["router"].get("/slo/status")["dispatcher"]["pd_pairs"] >= len(PROMPTS)


def test_the_router_link_carries_nothing_in_the_clear(pool: dict) -> None:
    pool["router"].generate(PROMPTS[0], 4)
    time.sleep(1.0)  # heartbeats and load reports keep flowing meanwhile
    capture: Capture = pool["capture"]
    seen = bytes(capture.payload)
    assert capture.packets > 20 and len(seen) > 2000, "no router traffic was captured on B's link"
    for field in (b"input_ids", b"sampling_params", b"worker_id", b"heartbeat", b"prefill-b"):
        assert field not in seen, f"{field!r} crossed the link in the clear"


def test_a_plaintext_worker_cannot_join_from_the_other_host(pool: dict, hosts: Hosts) -> None:
    b, addr_a = hosts.b, hosts.addr_a
    script = (
        "import zmq, sys; c = zmq.Context(); s = c.socket(zmq.DEALER); s.setsockopt(zmq.IMMEDIATE, 1); "
        f"s.setsockopt(zmq.LINGER, 0); s.connect('tcp://{addr_a}:{ROUTER_WORKERS}'); "
        "import time; time.sleep(1.5)\n"
        "try:\n s.send(b'{}', zmq.NOBLOCK); sys.exit(1)\nexcept zmq.Again:\n sys.exit(0)"
    )
    done = subprocess.run(["ip", "netns", "exec", b.name, sys.executable, "-c", script], timeout=30)
    assert done.returncode == 0, "a plaintext peer completed a handshake with the CURVE router"


def test_the_namespaces_are_not_loopback_to_each_other(pool: dict, hosts: Hosts) -> None:
    a, b = hosts.a, hosts.b
    probe = "import socket; s = socket.socket(); s.settimeout(2); print(s.connect_ex(('127.0.0.1', %d)))"
    done = subprocess.run(
        ["ip", "netns", "exec", b.name, sys.executable, "-c", probe % ROUTER_HTTP],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.stdout.strip() != "0", "B reached the router on its own loopback: the hosts are not apart"
    assert Path(a.path).exists() and Path(b.path).exists()
