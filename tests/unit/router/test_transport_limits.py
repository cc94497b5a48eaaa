"""What an unauthenticated or stuck peer can make the router's socket hold, on real ZMQ sockets:
an oversized frame gets its sender disconnected before it is buffered, the peer-address table
stays bounded however many peers speak, and a worker that stops reading delays nobody else
(its messages wait in a bounded outbox and reach it in order once it reads again)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import zmq
import zmq.asyncio
from zmq.utils.monitor import recv_monitor_message

from router.protocol import Heartbeat, Submit, TokenChunk
from router.transport import CurveKeys, RouterEndpoint, WorkerEndpoint
from tests.unit.router.test_transport import raw_socket, worker_facing

# Generous: each wait is for something that happens at once unless the code under test blocks.
TIMEOUT_S = 60.0


def _run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), TIMEOUT_S))


async def _wait_event(monitor: zmq.asyncio.Socket, event: int) -> None:
    while True:
        msg = await recv_monitor_message(monitor)  # type: ignore[misc]
        if msg["event"] == event:
            return


@contextmanager
def _watched(
    ctx: zmq.asyncio.Context, kind: int, events: int
) -> Iterator[tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]]:
    """A raw socket and the monitor that sees its connections come and go; both closed at the end."""
    with raw_socket(ctx, kind) as raw:
        monitor = raw.get_monitor_socket(events)
        try:
            yield raw, monitor
        finally:
            raw.disable_monitor()
            monitor.close(linger=0)


def test_an_oversized_frame_disconnects_its_sender_before_the_router_reads_it(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint(ctx=ctx, max_bytes=4096)
        good = WorkerEndpoint(router.address, "w1", ctx=ctx)
        try:
            with _watched(ctx, zmq.DEALER, zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED) as (raw, monitor):
                raw.connect(router.address)
                await _wait_event(monitor, zmq.EVENT_CONNECTED)
                await raw.send(b"x" * 100_000)
                await _wait_event(monitor, zmq.EVENT_DISCONNECTED)  # libzmq cut it off
                await good.send(Heartbeat(worker_id="w1", seq=1), wait_s=30.0)
                identity, msg = await router.recv()
                assert (identity, msg) == (b"w1", Heartbeat(worker_id="w1", seq=1))
                assert router.dropped == 0  # the big frame never reached the application
        finally:
            good.close()
            router.close()

    _run(go)


def test_a_worker_disconnects_a_router_that_sends_an_oversized_frame(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        with _watched(ctx, zmq.ROUTER, zmq.EVENT_DISCONNECTED) as (raw, monitor):
            async with worker_facing(raw, ctx, Heartbeat(worker_id="w0", seq=0), max_bytes=4096) as (worker, identity):
                await raw.send_multipart([identity, b"x" * 100_000])
                await _wait_event(monitor, zmq.EVENT_DISCONNECTED)
                assert worker.dropped == 0

    _run(go)


def test_the_peer_table_stays_bounded_however_many_peers_speak(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint(ctx=ctx, max_peers=8)
        peers: list[zmq.asyncio.Socket] = []
        try:
            for i in range(40):
                sock = ctx.socket(zmq.DEALER)  # no routing id: libzmq makes up a new one each time
                sock.setsockopt(zmq.LINGER, 0)
                sock.connect(router.address)
                peers.append(sock)
                await sock.send(Heartbeat(worker_id="w0", seq=i).to_wire())
            seen = []
            for _ in peers:
                identity, _ = await router.recv()
                seen.append(identity)
                assert router.peers_known <= 8
            assert len(set(seen)) == len(peers)
            assert router.peer_host(seen[-1]) == "127.0.0.1"  # the latest speaker is remembered
            assert router.peer_host(seen[0]) is None  # the oldest was let go
        finally:
            for sock in peers:
                sock.close(linger=0)
            router.close()

    _run(go)


def _submit(i: int) -> Submit:
    return Submit(rid=f"r{i}", input_ids=list(range(1, 16_001)), sampling_params={})


def test_a_worker_that_stops_reading_delays_no_one_else(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint(ctx=ctx, send_hwm=1)
        stuck = ctx.socket(zmq.DEALER)
        stuck.setsockopt(zmq.LINGER, 0)
        stuck.setsockopt(zmq.RCVHWM, 1)
        stuck.setsockopt(zmq.ROUTING_ID, b"stuck")
        good = WorkerEndpoint(router.address, "w1", ctx=ctx)
        try:
            stuck.connect(router.address)
            await stuck.send(Heartbeat(worker_id="stuck", seq=0).to_wire())
            await good.send(Heartbeat(worker_id="w1", seq=0), wait_s=30.0)
            for _ in range(2):
                await router.recv()
            accepted: list[str] = []
            refused = 0
            for i in range(1200):  # far more than its socket buffers and its outbox take
                # each send must return at once, whatever the stuck worker's queue holds
                if await asyncio.wait_for(router.send(b"stuck", _submit(i)), 10.0):
                    accepted.append(f"r{i}")
                else:
                    refused += 1
            assert refused > 0  # the outbox is bounded: the excess is refused, not held
            assert await asyncio.wait_for(router.send(b"w1", _submit(-1)), 10.0)
            assert (await good.recv()).rid == "r-1"  # type: ignore[attr-defined]
            received = []
            while len(received) < len(accepted):  # it reads again: everything queued arrives in order
                received.append((await stuck.recv()).split(b'"rid":"', 1)[1].split(b'"', 1)[0].decode())
            assert received == accepted
        finally:
            stuck.close(linger=0)
            good.close()
            router.close()

    _run(go)


def test_a_large_frame_is_decoded_only_from_a_registered_connection(ctx: zmq.asyncio.Context) -> None:
    async def go() -> None:
        router = RouterEndpoint(ctx=ctx)
        worker = WorkerEndpoint(router.address, "w0", ctx=ctx)
        big = TokenChunk(rid="r1", worker_id="w0", token_ids=list(range(1, 30_001)), completion_tokens=30_000)
        try:
            await worker.send(big, wait_s=30.0)  # a stranger's: dropped undecoded
            await worker.send(Heartbeat(worker_id="w0", seq=1))
            identity, msg = await router.recv()
            assert msg == Heartbeat(worker_id="w0", seq=1) and router.dropped == 1
            router.trust(identity)  # what the dispatcher does once the worker registered
            await worker.send(big)
            assert await router.recv() == (identity, big)
        finally:
            worker.close()
            router.close()

    _run(go)


def test_a_frame_at_the_limit_passes_an_encrypted_link(ctx: zmq.asyncio.Context, tmp_path: Path) -> None:
    import zmq.auth

    zmq.auth.create_certificates(str(tmp_path), "router")

    async def go() -> None:
        limit = 8192
        router = RouterEndpoint(ctx=ctx, max_bytes=limit, curve=CurveKeys.for_router(tmp_path / "router.key_secret"))
        worker = WorkerEndpoint(
            router.address, "w0", ctx=ctx, max_bytes=limit, curve=CurveKeys.for_worker(tmp_path / "router.key")
        )
        try:
            n = 1
            while len(_chunk(n + 1).to_wire()) <= limit:  # the largest chunk the limit allows
                n += 1
            await worker.send(_chunk(n), wait_s=30.0)
            identity, msg = await router.recv()
            router.trust(identity)
            assert msg == _chunk(n) and len(msg.to_wire()) <= limit
            assert await router.send(identity, Submit(rid="r", input_ids=[1] * (limit // 2 - 100), sampling_params={}))
            assert len((await worker.recv()).to_wire()) > limit - 400  # the router's side too
        finally:
            worker.close()
            router.close()

    _run(go)


def _chunk(n: int) -> TokenChunk:
    return TokenChunk(rid="r", worker_id="w0", token_ids=[7] * n, completion_tokens=n)
