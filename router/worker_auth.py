"""The worker credential: a secret shared by the router and its workers (never a client's API
key), proved in a nonce handshake and then used to authenticate every router -> worker message.

Handshake, on Register:
1. the worker sends Register with a fresh nonce `wn`;
2. the router answers Challenge with a fresh nonce `rn`, remembered for that connection for
   `CHALLENGE_TTL_S` and usable once;
3. the worker sends Register again with `challenge=rn` and `proof = HMAC(secret, "register" |
   rn | wn | the Register without its proof)`;
4. the router checks the proof (constant time), forgets `rn` (a replayed Register finds no
   challenge), and Acks with `proof = HMAC(secret, "ack" | wn | rn)`, which the worker checks
   before it takes any Submit: a router that does not know the secret cannot feed it work.
Both ends then hold `HMAC(secret, "session" | rn | wn)`: every router -> worker message travels
Sealed with an HMAC under that key and a sequence number the worker accepts only increasing.

Worker -> router messages are tied to the connection that registered (its routing identity is
random per process, never announced), so a peer without the secret can neither register nor
speak for a registered worker. Encryption of the link is a separate option (CurveZMQ).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from router.protocol import Ack, Challenge, Message, ProtocolError, Register, Sealed, decode

logger = logging.getLogger(__name__)

SECRET_ENV = "SGLANG_SLO_WORKER_SECRET"
CHALLENGE_TTL_S = 10.0
MAX_PENDING_CHALLENGES = 4096
MIN_SECRET_BYTES = 16


class AuthError(ValueError):
    """A message that fails authentication; it is dropped and counted."""


def load_worker_secret(
    value: str | None = None, path: str | None = None, env: Mapping[str, str] = os.environ
) -> bytes | None:
    """The secret from `--worker-secret`, else `--worker-secret-file`, else $SGLANG_SLO_WORKER_SECRET;
    None when none is given. Too short a secret is refused (ValueError)."""
    if value is None and path is not None:
        value = Path(path).read_text().strip()
    if value is None:
        value = env.get(SECRET_ENV) or None
    if value is None:
        return None
    secret = value.encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the worker secret must be at least {MIN_SECRET_BYTES} bytes")
    return secret


def legacy_secret(api_key: str) -> bytes:
    """The credential when only a client API key is configured: derived from it, so old setups
    keep working (with the handshake's replay protection), though anyone holding the client key
    could then join as a worker. Give `--worker-secret` to close that."""
    return hashlib.sha256(b"sglang-slo worker credential\0" + api_key.encode()).digest()


def resolve_worker_secret(
    value: str | None, path: str | None, api_key: str | None, configured: bytes | None = None
) -> tuple[bytes | None, str]:
    """The credential a router or worker uses, and where it came from ("worker secret",
    "api key (legacy)" or "none"). `configured` is the worker key of the access file
    (AccessTable.worker_secret()); given with a different --worker-secret, neither is guessed
    at (ValueError)."""
    secret = load_worker_secret(value, path)
    if configured is not None:
        if secret is not None and not hmac.compare_digest(secret, configured):
            raise ValueError("differs from the worker key of --auth-config: give the secret in one place")
        return configured, "worker secret"
    if secret is not None:
        return secret, "worker secret"
    if api_key:
        return legacy_secret(api_key), "api key (legacy)"
    return None, "none"


def new_nonce() -> str:
    return secrets.token_hex(16)


def _mac(key: bytes, *parts: bytes) -> str:
    return hmac.new(key, b"\0".join(parts), hashlib.sha256).hexdigest()


def register_proof(secret: bytes, reg: Register) -> str:
    """The worker's proof over its Register (which carries the challenge and its own nonce)."""
    assert reg.challenge is not None and reg.nonce is not None
    unsigned = replace(reg, proof=None).to_wire()
    return _mac(secret, b"register", reg.challenge.encode(), reg.nonce.encode(), unsigned)


def ack_proof(secret: bytes, worker_nonce: str, challenge: str) -> str:
    return _mac(secret, b"ack", worker_nonce.encode(), challenge.encode())


def session_key(secret: bytes, challenge: str, worker_nonce: str) -> bytes:
    return hmac.new(
        secret, b"\0".join((b"session", challenge.encode(), worker_nonce.encode())), hashlib.sha256
    ).digest()


def seal(key: bytes, seq: int, msg: Message) -> Sealed:
    body = msg.to_wire()
    return Sealed(seq=seq, mac=_mac(key, str(seq).encode(), body), body=body.decode())


def unseal(key: bytes, sealed: Sealed, after_seq: int) -> Message:
    """The inner message; AuthError when the MAC is wrong or the sequence number is not new."""
    body = sealed.body.encode()
    if not hmac.compare_digest(sealed.mac, _mac(key, str(sealed.seq).encode(), body)):
        raise AuthError("bad MAC on a sealed message")
    if sealed.seq <= after_seq:
        raise AuthError(f"replayed sealed message (seq {sealed.seq} <= {after_seq})")
    try:
        inner = decode(body)
    except ProtocolError as exc:
        raise AuthError(f"sealed body: {exc}") from None
    if isinstance(inner, Sealed):
        raise AuthError("nested sealed message")
    return inner


@dataclass
class _Session:
    key: bytes
    seq: int = 0


class RouterAuth:
    """The router's side; disabled (everything accepted, nothing sealed) without a secret."""

    def __init__(self, secret: bytes | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.secret = secret
        self.clock = clock
        self._pending: OrderedDict[bytes, tuple[str, float]] = OrderedDict()  # identity -> (nonce, expiry)
        self._sessions: dict[str, _Session] = {}  # worker_id -> session

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def challenge(self, identity: bytes) -> Challenge:
        """A fresh challenge for this connection (replacing any earlier one)."""
        nonce = new_nonce()
        self._pending.pop(identity, None)
        self._pending[identity] = (nonce, self.clock() + CHALLENGE_TTL_S)
        while len(self._pending) > MAX_PENDING_CHALLENGES:
            self._pending.popitem(last=False)
        return Challenge(nonce=nonce)

    def verify(self, identity: bytes, reg: Register) -> str | None:
        """None when `reg` proves the secret over this connection's live challenge, else why not.
        The challenge is spent either way."""
        assert self.secret is not None
        pending = self._pending.pop(identity, None)
        if reg.proof is None or reg.challenge is None or reg.nonce is None:
            return "missing proof of the worker secret"
        if pending is None or pending[1] < self.clock() or not hmac.compare_digest(pending[0], reg.challenge):
            return "unknown, used or expired challenge"
        if not hmac.compare_digest(reg.proof, register_proof(self.secret, reg)):
            return "wrong worker secret"
        return None

    def accept(self, reg: Register, ack: Ack) -> Ack:
        """The accepted Ack with the router's proof; opens the worker's session."""
        assert self.secret is not None and reg.challenge is not None and reg.nonce is not None
        self._sessions[reg.worker_id] = _Session(session_key(self.secret, reg.challenge, reg.nonce))
        return replace(ack, proof=ack_proof(self.secret, reg.nonce, reg.challenge))

    def seal(self, worker_id: str, msg: Message) -> Message | None:
        """`msg` as sent to the worker: Sealed under its session (None: no session, do not send)."""
        if not self.enabled:
            return msg
        session = self._sessions.get(worker_id)
        if session is None:
            return None
        session.seq += 1
        return seal(session.key, session.seq, msg)

    def forget(self, worker_id: str) -> None:
        self._sessions.pop(worker_id, None)


class WorkerAuth:
    """The worker's side. Without a secret it trusts the router as before (loopback setups)."""

    UNSEALED_OK = (Ack, Challenge)  # what a router may send before (or outside) a session

    def __init__(self, secret: bytes | None) -> None:
        self.secret = secret
        self.nonce: str | None = None
        self.challenge: str | None = None
        self._session: _Session | None = None

    @property
    def enabled(self) -> bool:
        return self.secret is not None

    def hello(self, reg: Register) -> Register:
        """The first Register of a handshake (a fresh nonce, no proof yet)."""
        if not self.enabled:
            return reg
        self.nonce, self.challenge, self._session = new_nonce(), None, None
        return replace(reg, nonce=self.nonce, challenge=None, proof=None)

    def answer(self, challenge: Challenge, reg: Register) -> Register | None:
        """The Register that proves the secret over `challenge` (None: no secret to prove)."""
        if self.secret is None or self.nonce is None:
            return None
        self.challenge = challenge.nonce
        signed = replace(reg, nonce=self.nonce, challenge=challenge.nonce, proof=None)
        return replace(signed, proof=register_proof(self.secret, signed))

    def accept(self, ack: Ack) -> bool:
        """Whether an accepted Ack comes from a router that knows the secret; opens the session."""
        if self.secret is None:
            return True
        if self.nonce is None or self.challenge is None or ack.proof is None:
            return False
        if not hmac.compare_digest(ack.proof, ack_proof(self.secret, self.nonce, self.challenge)):
            return False
        self._session = _Session(session_key(self.secret, self.challenge, self.nonce))
        return True

    def open(self, msg: Message) -> Message:
        """What the router really sent: a Sealed message checked and unwrapped; AuthError for
        anything that should have been sealed and was not, or fails its check."""
        if not self.enabled:
            return unseal_plain(msg)
        if isinstance(msg, self.UNSEALED_OK):
            return msg
        if not isinstance(msg, Sealed):
            raise AuthError(f"unsealed {msg.TYPE} from the router")
        if self._session is None:
            raise AuthError("sealed message before the handshake")
        inner = unseal(self._session.key, msg, self._session.seq)
        self._session.seq = msg.seq
        return inner


def unseal_plain(msg: Message) -> Message:
    if isinstance(msg, Sealed):
        raise AuthError("sealed message but no worker secret configured")
    return msg
