"""CurveZMQ on the router-worker link (keys from zmq.auth certificate files), the address a
worker's connection comes from, and the advertised URL the router derives from it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import zmq
import zmq.asyncio
import zmq.auth

from router.protocol import Ack, Register
from router.transport import CurveKeys, RouterEndpoint, WorkerEndpoint, is_loopback, with_peer_host

REGISTER = Register(worker_id="w0", gpu="cpu", model="m", kv_capacity_tokens=1000, max_running=4)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    zmq.auth.create_certificates(str(tmp_path), "router")
    zmq.auth.create_certificates(str(tmp_path), "worker")
    zmq.auth.create_certificates(str(tmp_path), "impostor")
    return tmp_path


def _run(coro: object) -> None:
    asyncio.run(asyncio.wait_for(coro, 10.0))  # type: ignore[arg-type]


def test_an_encrypted_link_carries_messages_and_names_the_peer(ctx: zmq.asyncio.Context, keys: Path) -> None:
    async def go() -> None:
        router = RouterEndpoint("tcp://127.0.0.1:0", ctx=ctx, curve=CurveKeys.for_router(keys / "router.key_secret"))
        worker = WorkerEndpoint(
            router.address, "w0", ctx=ctx, curve=CurveKeys.for_worker(keys / "router.key", keys / "worker.key_secret")
        )
        try:
            await worker.send(REGISTER)
            identity, msg = await router.recv()
            assert (identity, msg) == (b"w0", REGISTER)
            assert router.peer_host(b"w0") == "127.0.0.1"
            assert await router.send(identity, Ack(accepted=True))
            assert await worker.recv() == Ack(accepted=True)
            assert router.encrypted and worker.encrypted
        finally:
            worker.close()
            router.close()

    _run(go())


def _assert_never_reaches(ctx: zmq.asyncio.Context, keys: Path, worker_curve: CurveKeys | None) -> None:
    """The worker's handshake with the encrypted router never completes: nothing can be sent,
    and the router hears nothing."""

    async def go() -> None:
        router = RouterEndpoint("tcp://127.0.0.1:0", ctx=ctx, curve=CurveKeys.for_router(keys / "router.key_secret"))
        worker = WorkerEndpoint(router.address, "w0", ctx=ctx, curve=worker_curve)
        try:
            with pytest.raises(zmq.Again):
                await worker.send(REGISTER, wait_s=0.3)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(router.recv(), 0.5)
        finally:
            worker.close()
            router.close()

    _run(go())


def test_a_plaintext_worker_cannot_talk_to_an_encrypted_router(ctx: zmq.asyncio.Context, keys: Path) -> None:
    _assert_never_reaches(ctx, keys, None)


def test_a_worker_trusting_another_key_never_reaches_the_router(ctx: zmq.asyncio.Context, keys: Path) -> None:
    """A worker pointed at an impostor's public key refuses the real router (and vice versa)."""
    _assert_never_reaches(ctx, keys, CurveKeys.for_worker(keys / "impostor.key"))


def test_key_files_are_checked(keys: Path) -> None:
    with pytest.raises(ValueError, match="no secret key"):
        CurveKeys.for_router(keys / "router.key")  # the public half only
    with pytest.raises(ValueError, match="not a readable CURVE certificate"):
        CurveKeys.for_worker(keys / "missing.key")
    ephemeral = CurveKeys.for_worker(keys / "router.key")
    assert ephemeral.server_public == CurveKeys.for_router(keys / "router.key_secret").public
    assert len(ephemeral.secret) == 40


def test_a_wildcard_host_becomes_the_peer_address() -> None:
    assert with_peer_host("http://0.0.0.0:31000", "10.0.0.7") == "http://10.0.0.7:31000"
    assert with_peer_host("http://[::]:31000", "fd00::7") == "http://[fd00::7]:31000"
    assert with_peer_host("http://10.1.1.1:31000", "10.0.0.7") == "http://10.1.1.1:31000"  # advertised: kept
    assert with_peer_host("http://0.0.0.0:31000", None) == "http://0.0.0.0:31000"  # ipc: nothing known


def test_loopback_addresses() -> None:
    assert is_loopback("tcp://127.0.0.1:1") and is_loopback("ipc:///tmp/x") and is_loopback("tcp://localhost:5")
    assert not is_loopback("tcp://10.0.0.1:5") and not is_loopback("tcp://0.0.0.0:5")
