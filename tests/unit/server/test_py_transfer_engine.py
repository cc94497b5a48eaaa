"""The pure-Python Mooncake TransferEngine: real TCP between two engines in one process, and
the import hook that serves it as `mooncake.engine` when asked (or when the native one fails)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from server.cpu_support.py_transfer_engine import PYTHON_ENGINE_ENV, TransferEngine


def _engine() -> TransferEngine:
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    return engine


def test_batch_writes_land_in_the_peers_registered_memory() -> None:
    sender, receiver = _engine(), _engine()
    try:
        src = (ctypes.c_ubyte * 4096)(*[i % 251 for i in range(4096)])
        dst = (ctypes.c_ubyte * 4096)()
        base_src, base_dst = ctypes.addressof(src), ctypes.addressof(dst)
        assert receiver.batch_register_memory([base_dst], [4096]) == 0
        session = f"127.0.0.1:{receiver.get_rpc_port()}"
        assert sender.send_probe(session) == 0
        # two blocks, out of order, like per-layer KV pages
        ok = sender.batch_transfer_sync_write(
            session, [base_src + 1024, base_src], [base_dst + 2048, base_dst], [1024, 512]
        )
        assert ok == 0
        assert bytes(dst[2048:3072]) == bytes(src[1024:2048]) and bytes(dst[0:512]) == bytes(src[0:512])
        assert bytes(dst[512:2048]) == bytes(1536)  # nothing else was touched
        assert sender.transfer_sync_write(session, base_src + 10, base_dst + 4000, 96) == 0  # reused connection
        assert bytes(dst[4000:4096]) == bytes(src[10:106])
    finally:
        sender.close()
        receiver.close()


def test_a_write_outside_registered_memory_is_refused() -> None:
    sender, receiver = _engine(), _engine()
    try:
        src = (ctypes.c_ubyte * 64)(*range(64))
        dst = (ctypes.c_ubyte * 64)()
        receiver.register_memory(ctypes.addressof(dst), 32)  # only the first half
        session = f"127.0.0.1:{receiver.get_rpc_port()}"
        assert sender.transfer_sync_write(session, ctypes.addressof(src), ctypes.addressof(dst) + 16, 32) == -1
        assert bytes(dst) == bytes(64)
        assert receiver.unregister_memory(ctypes.addressof(dst)) == 0
        assert sender.transfer_sync_write(session, ctypes.addressof(src), ctypes.addressof(dst), 8) == -1
        assert sender.send_probe("127.0.0.1:1") == -1  # nobody there: an error code, not an exception
    finally:
        sender.close()
        receiver.close()


def test_the_import_hook_serves_it_as_mooncake_engine_when_asked() -> None:
    code = (
        "from server.cpu_support import activate; activate()\n"
        "from mooncake.engine import TransferEngine\n"
        "print(TransferEngine.__module__)\n"
    )
    env = {**os.environ, PYTHON_ENGINE_ENV: "python"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "server.cpu_support.py_transfer_engine"
