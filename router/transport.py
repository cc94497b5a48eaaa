"""Thin asyncio ZMQ endpoints for the router (ROUTER socket, binds) and its workers (DEALER, connect).

They only move validated `Message`s: framing, the loopback guard and socket hygiene (linger 0,
so a dead peer never blocks shutdown) live here; membership and routing live elsewhere. A
worker's ZMQ routing id is its worker_id unless it picks one (the worker agent picks a random,
unannounced one, which the registry binds to its worker_id at registration); a reconnecting
peer with the same routing id takes over its old connection (ROUTER_HANDOVER).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from types import TracebackType
from typing import TypeVar

import zmq
import zmq.asyncio

from router.protocol import MAX_MESSAGE_BYTES, Message, ProtocolError, check_worker_id, decode

logger = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:0"  # port 0: the OS picks; read the real one from `.address`
_LOCAL_TRANSPORTS = ("ipc://", "inproc://")
SEND_HWM = 100_000  # token chunks of many streams may queue while the router catches up
_E = TypeVar("_E", bound="_Endpoint")


def check_loopback(address: str, allow_remote: bool = False) -> str:
    """Refuse non-loopback addresses: the protocol has no encryption and only a hashed-key check."""
    if allow_remote or address.startswith(_LOCAL_TRANSPORTS):
        return address
    if not address.startswith("tcp://"):
        raise ValueError(f"{address!r}: only tcp://, ipc:// or inproc:// addresses are supported")
    host, sep, port = address[len("tcp://") :].rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r}: expected tcp://HOST:PORT")
    host = host.strip("[]")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False  # "*", interface names, DNS names
        if not loopback:
            raise ValueError(f"{address!r} is not a loopback address; pass allow_remote=True to expose it")
    return address


def _socket(ctx: zmq.asyncio.Context, kind: int, address: str) -> zmq.asyncio.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class _Endpoint:
    def __init__(self, sock: zmq.asyncio.Socket, max_bytes: int) -> None:
        self._sock = sock
        self._max_bytes = max_bytes
        self.dropped = 0  # malformed frames logged and discarded

    def _decode(self, payload: bytes, peer: bytes | str) -> Message | None:
        try:
            return decode(payload, self._max_bytes)
        except ProtocolError as exc:
            self.dropped += 1
            logger.warning("dropping malformed message from %r: %s", peer, exc)
            return None

    @property
    def closed(self) -> bool:
        return self._sock.closed

    def close(self) -> None:
        """Idempotent; linger 0 discards unsent messages instead of blocking on a dead peer."""
        if not self._sock.closed:
            self._sock.close(linger=0)

    def __enter__(self: _E) -> _E:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class RouterEndpoint(_Endpoint):
    """The router's socket: many workers connect; messages come with the sender's identity."""

    def __init__(
        self,
        bind_addr: str = DEFAULT_BIND,
        *,
        allow_remote: bool = False,
        ctx: zmq.asyncio.Context | None = None,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        check_loopback(bind_addr, allow_remote)
        sock = _socket(ctx or zmq.asyncio.Context.instance(), zmq.ROUTER, bind_addr)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone worker errors instead of vanishing
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker reclaims its routing id
        try:
            sock.bind(bind_addr)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        super().__init__(sock, max_bytes)
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def recv(self) -> tuple[bytes, Message]:
        """The next well-formed message; malformed frames are logged, counted and skipped."""
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 2:
                self.dropped += 1
                logger.warning("dropping a %d-part message from %r (want 1 payload frame)", len(frames) - 1, frames[0])
                continue
            identity, payload = frames
            msg = self._decode(payload, identity)
            if msg is None:
                continue
            return identity, msg  # which connection may speak for which worker: the registry's call

    async def send(self, identity: bytes, msg: Message) -> bool:
        """False when no worker with that identity is connected (it died or never came)."""
        try:
            await self._sock.send_multipart([identity, msg.to_wire()])
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise
        return True


class WorkerEndpoint(_Endpoint):
    """A worker's socket to the router; it reconnects by itself if the router restarts."""

    def __init__(
        self,
        connect_addr: str,
        worker_id: str,
        *,
        allow_remote: bool = False,
        ctx: zmq.asyncio.Context | None = None,
        max_bytes: int = MAX_MESSAGE_BYTES,
        identity: bytes | None = None,  # the routing id (default: the worker id; agents use a random one)
    ) -> None:
        check_loopback(connect_addr, allow_remote)
        check_worker_id(worker_id)
        sock = _socket(ctx or zmq.asyncio.Context.instance(), zmq.DEALER, connect_addr)
        try:
            sock.setsockopt(zmq.ROUTING_ID, identity or worker_id.encode())
            # Nothing queues for a router that is not there: heartbeats and reports are perishable,
            # and a restarted router must not receive a backlog of stale ones (send raises Again).
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.connect(connect_addr)
        except zmq.ZMQError:
            sock.close(linger=0)
            raise
        super().__init__(sock, max_bytes)
        self.worker_id = worker_id

    async def send(self, msg: Message, wait_s: float = 1.0) -> None:
        """Raises zmq.Again when the router stays unreachable (or hopelessly behind) for `wait_s`."""
        payload = msg.to_wire()
        deadline = asyncio.get_running_loop().time() + wait_s
        while True:
            try:
                await self._sock.send(payload, flags=zmq.NOBLOCK)
                return
            except zmq.Again:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                await asyncio.sleep(0.005)  # connecting, or reconnecting to a restarted router

    async def recv(self) -> Message:
        """The next well-formed message from the router; malformed ones are logged and skipped."""
        while True:
            frames = await self._sock.recv_multipart()
            if len(frames) != 1:
                self.dropped += 1
                logger.warning("dropping a %d-frame message from the router", len(frames))
                continue
            msg = self._decode(frames[0], "router")
            if msg is not None:
                return msg
