"""A pure-Python stand-in for Mooncake's `TransferEngine`, for PD disaggregation on machines
where the native engine cannot load.

Mooncake's non-CUDA wheel links libibverbs and libnl even for TCP; without root those Debian
libraries cannot be installed and `import mooncake.engine` fails. SGLang's Mooncake backend
(KV manager, sender, receiver, bootstrap protocol) only needs the engine object below: register
memory regions, and write local bytes into a peer's registered memory. We serve it as
`mooncake.engine` through the CPU import hook (server/cpu_support/import_hooks.py) only when the
native module does not load, or when SGLANG_SLO_TRANSFER_ENGINE=python asks for it; nothing in
SGLang is edited.

Wire format (TCP, one connection per peer and thread, reused): a request is
`!4sBI` (magic, op, item count) then per item `!QQ` (peer address, length) and its bytes; the
answer is `!i` (0 ok, -1 refused). A write outside the peer's registered regions is refused,
so a bug cannot scribble over arbitrary memory.
"""

from __future__ import annotations

import bisect
import ctypes
import logging
import socket
import socketserver
import struct
import threading
from collections.abc import Sequence

logger = logging.getLogger(__name__)

MAGIC = b"SSPT"
OP_WRITE, OP_PROBE = 1, 2
_HEAD = struct.Struct("!4sBI")
_ITEM = struct.Struct("!QQ")
_STATUS = struct.Struct("!i")
PYTHON_ENGINE_ENV = "SGLANG_SLO_TRANSFER_ENGINE"  # "python": use this engine even if Mooncake loads


class Regions:
    """Registered memory: sorted, non-overlapping [start, end) ranges."""

    def __init__(self) -> None:
        self._starts: list[int] = []
        self._ends: dict[int, int] = {}
        self._lock = threading.Lock()

    def add(self, ptr: int, length: int) -> None:
        with self._lock:
            if ptr not in self._ends:
                bisect.insort(self._starts, ptr)
            self._ends[ptr] = ptr + length

    def remove(self, ptr: int) -> bool:
        with self._lock:
            if ptr not in self._ends:
                return False
            del self._ends[ptr]
            self._starts.remove(ptr)
            return True

    def covers(self, ptr: int, length: int) -> bool:
        with self._lock:
            i = bisect.bisect_right(self._starts, ptr) - 1
            return i >= 0 and ptr + length <= self._ends[self._starts[i]]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k
    return bytes(buf)


class _Handler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        engine: TransferEngine = self.server.engine  # type: ignore[attr-defined]
        sock: socket.socket = self.request
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                magic, op, count = _HEAD.unpack(_recv_exact(sock, _HEAD.size))
                if magic != MAGIC:
                    return
                status = 0
                for _ in range(count if op == OP_WRITE else 0):
                    addr, length = _ITEM.unpack(_recv_exact(sock, _ITEM.size))
                    data = _recv_exact(sock, length)
                    if engine.regions.covers(addr, length):
                        ctypes.memmove(addr, data, length)
                    else:
                        status = -1
                        logger.warning("refused a %d-byte write at %#x: not in a registered region", length, addr)
                sock.sendall(_STATUS.pack(status))
        except (ConnectionError, OSError):
            return


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class TransferEngine:
    """The subset of mooncake.engine.TransferEngine that SGLang's Mooncake backend calls."""

    def __init__(self) -> None:
        self.regions = Regions()
        self._server: _Server | None = None
        self._local = threading.local()  # per thread: {session id: socket}

    # --- set-up ---

    def initialize(self, hostname: str, metadata_server: str, protocol: str, device_name: str) -> int:
        host = hostname.split(":")[0] or "127.0.0.1"
        self._server = _Server((host, 0), _Handler)
        self._server.engine = self  # type: ignore[attr-defined]
        threading.Thread(target=self._server.serve_forever, name="py-transfer-engine", daemon=True).start()
        logger.info("pure-Python transfer engine listening on %s:%d", host, self.get_rpc_port())
        return 0

    def get_rpc_port(self) -> int:
        assert self._server is not None, "initialize() first"
        return int(self._server.server_address[1])

    def get_engine(self) -> TransferEngine:
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- memory ---

    def register_memory(self, ptr: int, length: int) -> int:
        self.regions.add(int(ptr), int(length))
        return 0

    def unregister_memory(self, ptr: int) -> int:
        return 0 if self.regions.remove(int(ptr)) else -1

    def batch_register_memory(self, ptrs: Sequence[int], lengths: Sequence[int]) -> int:
        for ptr, length in zip(ptrs, lengths, strict=True):
            self.register_memory(ptr, length)
        return 0

    def batch_unregister_memory(self, ptrs: Sequence[int]) -> int:
        return min((self.unregister_memory(p) for p in ptrs), default=0)

    # --- transfers ---

    def transfer_sync_write(self, session_id: str, buffer: int, peer_buffer_address: int, length: int) -> int:
        return self.batch_transfer_sync_write(session_id, [buffer], [peer_buffer_address], [length])

    def batch_transfer_sync_write(
        self, session_id: str, buffers: Sequence[int], peer_addresses: Sequence[int], lengths: Sequence[int]
    ) -> int:
        """Copy each local [buffer, buffer+length) into the peer's memory; 0 on success, -1 else."""
        frames = [_HEAD.pack(MAGIC, OP_WRITE, len(buffers))]
        for src, dst, length in zip(buffers, peer_addresses, lengths, strict=True):
            frames.append(_ITEM.pack(int(dst), int(length)))
            frames.append(ctypes.string_at(int(src), int(length)))
        return self._call(session_id, frames)

    def send_probe(self, session_id: str) -> int:
        return self._call(session_id, [_HEAD.pack(MAGIC, OP_PROBE, 0)])

    def _call(self, session_id: str, frames: list[bytes]) -> int:
        for attempt in (0, 1):  # a pooled connection the peer closed: reconnect once
            try:
                sock = self._socket(session_id)
                sock.sendall(b"".join(frames))
                (status,) = _STATUS.unpack(_recv_exact(sock, _STATUS.size))
                return status
            except (ConnectionError, OSError) as exc:
                self._drop(session_id)
                if attempt:
                    logger.warning("transfer to %s failed: %s", session_id, exc)
        return -1

    def _socket(self, session_id: str) -> socket.socket:
        pool: dict[str, socket.socket] = self._local.__dict__.setdefault("pool", {})
        sock = pool.get(session_id)
        if sock is None:
            host, _, port = session_id.rpartition(":")
            sock = socket.create_connection((host.strip("[]"), int(port)), timeout=30)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pool[session_id] = sock
        return sock

    def _drop(self, session_id: str) -> None:
        sock = self._local.__dict__.get("pool", {}).pop(session_id, None)
        if sock is not None:
            sock.close()
