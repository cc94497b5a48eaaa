"""Real ZMQ over tcp://127.0.0.1 on an ephemeral port: registration with identity, a Submit back,
malformed frames dropped without breaking the endpoint, and the loopback guard."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
import zmq
import zmq.asyncio

from router.protocol import Abort, Ack, Heartbeat, Message, ProtocolError, Register, Submit
from router.transport import RouterEndpoint, WorkerEndpoint, check_loopback
from server.process import free_port

TIMEOUT_S = 5.0
REGISTER = Register(worker_id="w0", gpu="cpu", model="m", kv_capacity_tokens=1000, max_running=4)


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), TIMEOUT_S))


@contextmanager
def raw_socket(ctx: zmq.asyncio.Context, kind: int) -> Iterator[zmq.asyncio.Socket]:
    """A bare ZMQ socket, free of the protocol, to send what an endpoint must refuse; closed at the end."""
    raw = ctx.socket(kind)
    raw.setsockopt(zmq.LINGER, 0)
    try:
        yield raw
    finally:
        raw.close(linger=0)


@asynccontextmanager
async def worker_facing(
    raw: zmq.asyncio.Socket, ctx: zmq.asyncio.Context, first: Message, **opts: Any
) -> AsyncIterator[tuple[WorkerEndpoint, bytes]]:
    """Worker "w0"'s endpoint (built with `opts`) connected to the raw ROUTER socket `raw`, which
    plays a router that may misbehave, once its `first` message has arrived: the endpoint and the
    identity that addresses it. The endpoint is closed at the end."""
    port = raw.bind_to_random_port("tcp://127.0.0.1")
    worker = WorkerEndpoint(f"tcp://127.0.0.1:{port}", "w0", ctx=ctx, **opts)
    try:
        await worker.send(first, wait_s=30.0)
        identity, _ = await raw.recv_multipart()
        yield worker, identity
    finally:
        worker.close()


def test_register_and_submit_round_trip(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint("tcp://127.0.0.1:0", ctx=ctx)
        worker = WorkerEndpoint(router.address, "w0", ctx=ctx)
        try:
            assert router.address.startswith("tcp://127.0.0.1:") and not router.address.endswith(":0")
            await worker.send(REGISTER)
            identity, msg = await router.recv()
            assert identity == b"w0" and msg == REGISTER
            assert await router.send(identity, Ack(accepted=True))
            submit = Submit(rid="r1", input_ids=[1, 2], sampling_params={"max_new_tokens": 4}, resume_output_ids=[7])
            assert await router.send(identity, submit)
            assert await worker.recv() == Ack(accepted=True)
            assert await worker.recv() == submit
        finally:
            worker.close()
            router.close()
        assert router.closed and worker.closed
        router.close()  # idempotent

    _run(go)


def test_malformed_frames_dropped_and_endpoint_keeps_working(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint(ctx=ctx)
        try:
            with raw_socket(ctx, zmq.DEALER) as raw:
                raw.setsockopt(zmq.ROUTING_ID, b"w0")
                raw.connect(router.address)
                await raw.send(b"\xff not json")
                await raw.send(b'{"type": "heartbeat", "version": 1, "worker_id": "w0", "seq": -1}')
                await raw.send_multipart([b"two", b"frames"])
                await raw.send(Heartbeat(worker_id="w0", seq=1).to_wire())
                identity, msg = await router.recv()
                assert (identity, msg) == (b"w0", Heartbeat(worker_id="w0", seq=1))
                assert router.dropped == 3  # which connection speaks for which worker: the registry's call
        finally:
            router.close()

    _run(go)


def test_worker_drops_malformed_from_router(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        with raw_socket(ctx, zmq.ROUTER) as raw:
            async with worker_facing(raw, ctx, REGISTER) as (worker, identity):
                await raw.send_multipart([identity, b"[]"])
                await raw.send_multipart([identity, Abort(rid="r9").to_wire()])
                assert await worker.recv() == Abort(rid="r9")
                assert worker.dropped == 1

    _run(go)


def test_send_to_unknown_identity_returns_false(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        with RouterEndpoint(ctx=ctx) as router:
            assert not await router.send(b"nobody", Ack(accepted=False, reason="x"))

    _run(go)


@pytest.mark.parametrize(
    "addr", ["tcp://0.0.0.0:5555", "tcp://*:5555", "tcp://10.1.2.3:5555", "tcp://eth0:5555", "udp://127.0.0.1:5"]
)
def test_non_loopback_refused(addr: str, ctx: zmq.asyncio.Context) -> None:
    with pytest.raises(ValueError):
        RouterEndpoint(addr, ctx=ctx)
    with pytest.raises(ValueError):
        WorkerEndpoint(addr, "w0", ctx=ctx)


@pytest.mark.parametrize(
    "addr", ["tcp://127.0.0.1:1", "tcp://127.5.0.1:1", "tcp://localhost:1", "tcp://[::1]:1", "ipc:///tmp/x"]
)
def test_loopback_and_local_accepted(addr: str) -> None:
    assert check_loopback(addr) == addr


def test_remote_allowed_when_asked(ctx: zmq.asyncio.Context) -> None:
    assert check_loopback("tcp://0.0.0.0:5555", allow_remote=True)
    # Connecting is lazy in ZMQ, so this opens nothing on the network.
    with WorkerEndpoint("tcp://10.255.255.1:5555", "w0", allow_remote=True, ctx=ctx) as worker:
        assert worker.worker_id == "w0"


def test_bad_worker_id_refused(ctx: zmq.asyncio.Context) -> None:
    with pytest.raises(ProtocolError):
        WorkerEndpoint("tcp://127.0.0.1:1", "", ctx=ctx)


def test_a_worker_queues_nothing_for_an_absent_router(ctx: zmq.asyncio.Context) -> None:
    """Heartbeats sent while the router is down fail fast, and a router that comes up later
    gets the next message, not a backlog of stale ones."""

    async def go() -> None:
        # a free port with nobody listening, outside the ephemeral range: a worker that keeps
        # reconnecting to an ephemeral port can be handed it as its own and connect to itself
        address = f"tcp://127.0.0.1:{free_port()}"
        worker = WorkerEndpoint(address, "w0", ctx=ctx)
        router = None
        try:
            for seq in range(3):
                with pytest.raises(zmq.Again):
                    await worker.send(Heartbeat(worker_id="w0", seq=seq), wait_s=0.05)
            router = RouterEndpoint(address, ctx=ctx)
            # waits for the reconnect, which a loaded host can take seconds to make
            await worker.send(Heartbeat(worker_id="w0", seq=3), wait_s=30.0)
            _, msg = await router.recv()
            assert msg == Heartbeat(worker_id="w0", seq=3)
        finally:
            worker.close()
            if router is not None:
                router.close()

    _run(go)
