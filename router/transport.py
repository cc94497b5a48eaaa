"""Thin asyncio ZMQ endpoints for the router (ROUTER socket, binds) and its workers (DEALER, connect).

They only move validated `Message`s: framing, the loopback guard, encryption and socket hygiene
(a worker's linger 0, so a dead router never blocks its shutdown; the router's a short linger, so
the Aborts it sends to workers as it stops still leave) live here; membership and routing live
elsewhere. A worker's ZMQ routing id is its worker_id unless it picks one (the worker agent
picks a random, unannounced one, which the router's registry binds to its worker_id at
registration); a reconnecting peer with the same routing id takes over its old connection
(ROUTER_HANDOVER).

Links that leave the machine are encrypted with CurveZMQ (pyzmq's libzmq ships it): the router
holds a key pair, a worker knows the router's public key (both from files in the zmq.auth
certificate format) and brings a key pair of its own or an ephemeral one. Who may join is decided
above the transport (the router's worker credential); CURVE makes the link private and proves to
the worker that it talks to the router holding the secret key.

The router also notes the address each worker's connection comes from (`peer_host`): a worker
bound to every interface advertises no address of its own, and is reached where it connects from.

Anyone who reaches the router's port can connect before authenticating, so nothing a peer sends
may grow without bound: libzmq drops a peer whose frame exceeds the protocol's limit before
buffering it (MAXMSGSIZE), a large frame is decoded only from a connection that registered, the
peer-address table is a bounded LRU, and a send never waits on
one worker's full queue (the rest queue in that worker's bounded outbox), so one slow worker
cannot stall the router's message handling for the others.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import OrderedDict, deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TypeVar
from urllib.parse import urlsplit, urlunsplit

import zmq
import zmq.asyncio

from router.protocol import MAX_MESSAGE_BYTES, Message, ProtocolError, check_worker_id, decode

logger = logging.getLogger(__name__)

DEFAULT_BIND = "tcp://127.0.0.1:0"  # port 0: the OS picks; read the real one from `.address`
_LOCAL_TRANSPORTS = ("ipc://", "inproc://")
SEND_HWM = 100_000  # token chunks of many streams may queue while the router catches up
MAX_PEERS = 4096  # peer addresses remembered (LRU): unauthenticated peers cannot grow the table
# Frames larger than this are only decoded from connections that registered (`trust`): a
# Register is small, and decoding a frame near MAX_MESSAGE_BYTES holds the event loop a while.
STRANGER_MAX_BYTES = 64 * 1024
OUTBOX_MESSAGES = 1024  # messages a worker whose queue is full may still have waiting for it
OUTBOX_BYTES = 64 * 1024 * 1024
OUTBOX_RETRY_S = 0.005
FRAME_OVERHEAD = 1024  # libzmq counts a CURVE frame with its box; decode() enforces the exact limit
CLOSE_LINGER_MS = 1000  # how long a closed router socket may still deliver (its last Aborts)
_E = TypeVar("_E", bound="_Endpoint")


def check_loopback(address: str, allow_remote: bool = False) -> str:
    """Refuse non-loopback addresses unless allowed (the launchers allow them with CURVE keys only)."""
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


def is_loopback(address: str) -> bool:
    """Whether a ZMQ address stays on this machine (ipc, inproc, or tcp to a loopback host)."""
    try:
        check_loopback(address)
    except ValueError:
        return False
    return True


def local_address_towards(address: str) -> str | None:
    """This machine's address on the route to a tcp:// ZMQ address (what a peer there sees it
    connect from, NAT aside); None when it cannot be told (no route, not tcp)."""
    import socket

    if not address.startswith("tcp://"):
        return None
    host, _, port = address[len("tcp://") :].rpartition(":")
    host = host.strip("[]")
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:  # no packet is sent
            probe.connect((host, int(port)))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def with_peer_host(http_url: str | None, peer_host: str | None) -> str | None:
    """A worker's HTTP address as the router reaches it: a wildcard host (the worker bound every
    interface and advertised no address) becomes the address its connection comes from."""
    if not http_url or not peer_host:
        return http_url
    parts = urlsplit(http_url)
    if (parts.hostname or "") not in WILDCARD_HOSTS:
        return http_url
    host = f"[{peer_host}]" if ":" in peer_host else peer_host
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True)
class CurveKeys:
    """CurveZMQ keys (Z85 bytes). The router: its own pair. A worker: its pair and the router's
    public key (`server_public`)."""

    public: bytes
    secret: bytes
    server_public: bytes | None = None

    @classmethod
    def for_router(cls, secret_key_file: str | Path) -> CurveKeys:
        public, secret = _load_certificate(secret_key_file)
        if secret is None:
            raise ValueError(f"{secret_key_file}: no secret key in it (the router needs its .key_secret file)")
        return cls(public, secret)

    @classmethod
    def for_worker(cls, router_public_key_file: str | Path, secret_key_file: str | Path | None = None) -> CurveKeys:
        """`secret_key_file` None: an ephemeral key pair (the link is encrypted all the same)."""
        server_public, _ = _load_certificate(router_public_key_file)
        if secret_key_file is None:
            public, secret = zmq.curve_keypair()
        else:
            public, maybe_secret = _load_certificate(secret_key_file)
            if maybe_secret is None:
                raise ValueError(f"{secret_key_file}: no secret key in it (a .key_secret file)")
            secret = maybe_secret
        return cls(public, secret, server_public)


def _load_certificate(path: str | Path) -> tuple[bytes, bytes | None]:
    """zmq.auth's certificate files: `name.key` (public) or `name.key_secret` (both)."""
    import zmq.auth

    if not zmq.has("curve"):
        raise ValueError("this libzmq has no CURVE support")
    try:
        public, secret = zmq.auth.load_certificate(str(path))
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable CURVE certificate ({exc})") from None
    return public, secret


def _apply_curve(sock: zmq.asyncio.Socket, keys: CurveKeys, server: bool) -> None:
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    if server:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
    else:
        if keys.server_public is None:
            raise ValueError("a worker's CURVE keys need the router's public key")
        sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)


@contextmanager
def _secured(sock: zmq.asyncio.Socket, curve: CurveKeys | None, server: bool) -> Iterator[None]:
    """Applies the CURVE keys (if any) for the body, which binds or connects `sock`; a bad key or
    address closes the socket before the error goes on, so a refused endpoint leaks no socket."""
    try:
        if curve is not None:
            _apply_curve(sock, curve, server)
        yield
    except (zmq.ZMQError, ValueError):
        sock.close(linger=0)
        raise


def _socket(ctx: zmq.asyncio.Context, kind: int, address: str, max_bytes: int) -> zmq.asyncio.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    # libzmq disconnects a peer whose frame is larger, before buffering it: the protocol refuses
    # such a frame anyway, and a stranger must not make the router hold gigabytes first.
    sock.setsockopt(zmq.MAXMSGSIZE, max_bytes + FRAME_OVERHEAD)
    if address.startswith("tcp://["):
        sock.setsockopt(zmq.IPV6, 1)
    return sock


class _Endpoint:
    def __init__(self, sock: zmq.asyncio.Socket, max_bytes: int) -> None:
        self._sock = sock
        self._max_bytes = max_bytes
        self._close_linger_ms = 0
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
        """Idempotent; unsent messages are discarded after `_close_linger_ms` (the context's
        term() waits that long for them; a dead peer has none pending)."""
        if not self._sock.closed:
            self._sock.close(linger=self._close_linger_ms)

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
        curve: CurveKeys | None = None,
        max_peers: int = MAX_PEERS,
        stranger_max_bytes: int = STRANGER_MAX_BYTES,
        send_hwm: int | None = None,  # per worker, in libzmq's queue (None: libzmq's default)
    ) -> None:
        check_loopback(bind_addr, allow_remote)
        sock = _socket(ctx or zmq.asyncio.Context.instance(), zmq.ROUTER, bind_addr, max_bytes)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)  # sending to a gone worker errors instead of vanishing
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted worker reclaims its routing id
        if send_hwm is not None:
            sock.setsockopt(zmq.SNDHWM, send_hwm)
        with _secured(sock, curve, server=True):
            sock.bind(bind_addr)
        super().__init__(sock, max_bytes)
        self._close_linger_ms = CLOSE_LINGER_MS
        self.address: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.encrypted = curve is not None
        # identity -> the address its connection comes from, most recent speaker last
        self._peers: OrderedDict[bytes, str] = OrderedDict()
        self._max_peers = max_peers
        self._stranger_max_bytes = stranger_max_bytes
        self._trusted: OrderedDict[bytes, None] = OrderedDict()  # registered connections, newest last
        self._outboxes: dict[bytes, _Outbox] = {}
        self._drains: set[asyncio.Task[None]] = set()

    def peer_host(self, identity: bytes) -> str | None:
        """Where the worker with this identity connects from (tcp only; None before a message,
        or once MAX_PEERS others have spoken since its last one)."""
        return self._peers.get(identity)

    def trust(self, identity: bytes) -> None:
        """The connection registered: its frames may be as large as the protocol allows."""
        self._trusted[identity] = None
        self._trusted.move_to_end(identity)
        while len(self._trusted) > self._max_peers:
            self._trusted.popitem(last=False)

    @property
    def peers_known(self) -> int:
        return len(self._peers)

    def _note_peer(self, identity: bytes, peer: str) -> None:
        self._peers[identity] = peer
        self._peers.move_to_end(identity)
        while len(self._peers) > self._max_peers:
            self._peers.popitem(last=False)

    async def recv(self) -> tuple[bytes, Message]:
        """The next well-formed message; malformed frames are logged, counted and skipped."""
        while True:
            frames = await self._sock.recv_multipart(copy=False)
            if len(frames) != 2:
                self.dropped += 1
                logger.warning(
                    "dropping a %d-part message from %r (want 1 payload frame)", len(frames) - 1, frames[0].bytes
                )
                continue
            identity, payload = frames[0].bytes, frames[1].bytes
            if len(payload) > self._stranger_max_bytes and identity not in self._trusted:
                self.dropped += 1  # decoding it would hold the event loop for a stranger
                logger.warning("dropping a %d-byte frame from unregistered peer %r", len(payload), identity)
                continue
            peer = _peer_address(frames[1])
            if peer is not None:
                self._note_peer(identity, peer)
            msg = self._decode(payload, identity)
            if msg is None:
                continue
            return identity, msg  # which connection may speak for which worker: the registry's call

    async def send(self, identity: bytes, msg: Message) -> bool:
        """False when no worker with that identity is connected (it died or never came), or when
        its queue and its outbox are both full (it stopped reading). Never waits on the worker:
        a message its queue cannot take yet waits in its outbox, in order."""
        frames = [identity, msg.to_wire()]
        box = self._outboxes.get(identity)
        if box is None:
            try:
                await self._sock.send_multipart(frames, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                box = self._outboxes[identity] = _Outbox()
                task = asyncio.get_running_loop().create_task(self._drain(identity, box))
                self._drains.add(task)
                task.add_done_callback(self._drains.discard)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:
                    return False
                raise
        if not box.put(frames):
            logger.warning("worker %r reads nothing: its outbox is full, dropping a %s", identity, msg.TYPE)
            return False
        return True

    async def _drain(self, identity: bytes, box: _Outbox) -> None:
        """Hands `box` to libzmq as the worker's queue frees up; gives up when it disconnects."""
        try:
            while box.items and not self._sock.closed:
                try:
                    await self._sock.send_multipart(box.items[0], flags=zmq.NOBLOCK)
                    box.pop()
                except zmq.Again:
                    await asyncio.sleep(OUTBOX_RETRY_S)
                except zmq.ZMQError as exc:
                    logger.warning("dropping %d queued messages for %r: %s", len(box.items), identity, exc)
                    break
        finally:
            self._outboxes.pop(identity, None)

    def close(self) -> None:
        for task in list(self._drains):
            task.cancel()
        super().close()


class _Outbox:
    """Messages waiting for one worker whose libzmq queue is full; bounded in count and bytes."""

    def __init__(self) -> None:
        self.items: deque[list[bytes]] = deque()
        self.bytes = 0

    def put(self, frames: list[bytes]) -> bool:
        size = len(frames[1])
        if len(self.items) >= OUTBOX_MESSAGES or self.bytes + size > OUTBOX_BYTES:
            return False
        self.items.append(frames)
        self.bytes += size
        return True

    def pop(self) -> None:
        self.bytes -= len(self.items.popleft()[1])


def _peer_address(frame: zmq.Frame) -> str | None:
    try:
        peer = frame.get("Peer-Address")
    except (zmq.ZMQError, KeyError, AttributeError):  # ipc/inproc have none
        return None
    return peer if isinstance(peer, str) and peer else None


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
        curve: CurveKeys | None = None,
        identity: bytes | None = None,  # the routing id (default: the worker id; agents use a random one)
    ) -> None:
        check_loopback(connect_addr, allow_remote)
        check_worker_id(worker_id)
        sock = _socket(ctx or zmq.asyncio.Context.instance(), zmq.DEALER, connect_addr, max_bytes)
        with _secured(sock, curve, server=False):
            sock.setsockopt(zmq.ROUTING_ID, identity or worker_id.encode())
            # Nothing queues for a router that is not there: heartbeats and reports are perishable,
            # and a restarted router must not receive a backlog of stale ones (send raises Again).
            sock.setsockopt(zmq.IMMEDIATE, 1)
            sock.setsockopt(zmq.SNDHWM, SEND_HWM)
            sock.connect(connect_addr)
        super().__init__(sock, max_bytes)
        self.worker_id = worker_id
        self.encrypted = curve is not None

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
