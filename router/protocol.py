"""Router <-> worker wire format: one orjson object per ZMQ frame, tagged with `type` and `version`.

Both ends validate every field (at construction and in `decode`), so a bug or a stray peer shows
up as a `ProtocolError` naming the bad field instead of a KeyError deep in the router. Messages
are frozen dataclasses; `decode` is the only way bytes become a message.
"""

from __future__ import annotations

import math
import re
from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import orjson

from router.views import WorkerView
from scheduler.core.shed_wire import shed_from
from scheduler.core.slo import SloValidationError, parse_slo

PROTOCOL_VERSION = 1
WORKER_ROLES = ("mixed", "prefill", "decode")
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # a 128k-token prompt plus resume ids is ~2 MiB of JSON
MAX_ID_LEN = 256
MAX_TOKEN_ID = 2**31 - 1
MAX_INFLIGHT_LISTED = 4096  # rids a LoadReport lists (more: the router skips reconciliation)
_HEX_RE = re.compile(r"[0-9a-f]{32,128}")
# Worker ids double as ZMQ routing ids (must not start with a zero byte) and metric labels.
_WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")


class ProtocolError(ValueError):
    """A malformed message; `field` names what was wrong ("frame" for the frame as a whole)."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


# --- field validators: each returns the (normalised) value or raises ProtocolError(name) ---


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _ident(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(name, f"must be a string, got {_type_name(value)}")
    if not 0 < len(value) <= MAX_ID_LEN:
        raise ProtocolError(name, f"must be 1..{MAX_ID_LEN} chars")
    return value


def check_worker_id(value: Any, name: str = "worker_id") -> str:
    """Worker ids double as ZMQ routing ids and metric labels, hence the narrow alphabet."""
    _ident(value, name)
    if not _WORKER_ID_RE.fullmatch(value):
        raise ProtocolError(name, "must be 1..128 chars of [A-Za-z0-9._:@-], starting alphanumeric")
    return value


def _opt_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(name, f"must be a string or null, got {_type_name(value)}")
    return value


def _str(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(name, f"must be a string, got {_type_name(value)}")
    return value


def _count(value: Any, name: str, minimum: int = 0) -> int:
    if type(value) is not int:  # excludes bool, and floats from ints beyond 64 bits
        raise ProtocolError(name, f"must be an integer, got {_type_name(value)}")
    if value < minimum:
        raise ProtocolError(name, f"must be >= {minimum}, got {value}")
    return value


def _rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(name, f"must be a number, got {_type_name(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite or value < 0:
        raise ProtocolError(name, f"must be a non-negative finite number, got {value}")
    return float(value)


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(name, f"must be a boolean, got {_type_name(value)}")
    return value


def _hex(value: Any, name: str) -> str:
    """Nonces and MACs: lowercase hex, 32..128 digits."""
    if not isinstance(value, str) or not _HEX_RE.fullmatch(value):
        raise ProtocolError(name, "must be 32..128 lowercase hex digits")
    return value


def _opt_hex(value: Any, name: str) -> str | None:
    return None if value is None else _hex(value, name)


def _obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(name, f"must be an object, got {_type_name(value)}")
    return value


def _token_ids(value: Any, name: str, non_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ProtocolError(name, f"must be a list of token ids, got {_type_name(value)}")
    if non_empty and not value:
        raise ProtocolError(name, "must not be empty")
    if not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_TOKEN_ID):
        return tuple(value)  # fast path: C-speed checks over long prompts
    for i, tok in enumerate(value):
        if type(tok) is not int or not 0 <= tok <= MAX_TOKEN_ID:
            raise ProtocolError(f"{name}[{i}]", f"must be a token id in 0..{MAX_TOKEN_ID}, got {tok!r}")
    return tuple(value)


def _set(msg: Message, name: str, value: Any) -> None:
    object.__setattr__(msg, name, value)  # normalising a frozen dataclass in __post_init__


# --- messages ---


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of every wire message; subclasses set TYPE and validate in `__post_init__`."""

    TYPE: ClassVar[str] = ""

    def to_wire(self) -> bytes:
        """orjson bytes; None-valued optional fields are left out (decode restores them)."""
        payload: dict[str, Any] = {"type": self.TYPE, "version": PROTOCOL_VERSION}
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if value is not None:
                payload[name] = value
        try:
            raw = orjson.dumps(payload)
        except orjson.JSONEncodeError as exc:
            raise ProtocolError("frame", f"not JSON-serialisable: {exc}") from None
        if len(raw) > MAX_MESSAGE_BYTES:
            raise ProtocolError("frame", f"{len(raw)} bytes exceeds the {MAX_MESSAGE_BYTES}-byte limit")
        return raw


# worker -> router


@dataclass(frozen=True, kw_only=True)
class Register(Message):
    TYPE: ClassVar[str] = "register"
    worker_id: str
    gpu: str
    model: str
    kv_capacity_tokens: int
    max_running: int
    http_url: str | None = None  # the worker's own HTTP server, for operators only (never contacted)
    # The worker-secret handshake (router/worker_auth.py): the worker's nonce; then, answering the
    # router's Challenge, the challenge it echoes and the HMAC proof over this message.
    nonce: str | None = None
    challenge: str | None = None
    proof: str | None = None
    # Random per worker process: a Register with a new one is a restart (its requests are gone),
    # one with the same is a repeat (a lost Ack, a restarted router) and keeps them.
    incarnation: str | None = None
    # PD disaggregation: "prefill" and "decode" workers are paired per request (a prefill
    # worker's KV goes to a decode worker through SGLang's transfer engine); "mixed" does both.
    role: str = "mixed"
    bootstrap_port: int | None = None  # a prefill worker's KV bootstrap server (SGLang's)
    tier_ms: float | None = None  # the TPOT tier it starts in (PolyServe), when configured
    time_scale: float = 1.0  # an emulated GPU's slowdown: its steps take this many times the card's
    max_input_tokens: int | None = None  # the longest prompt its model takes (the router refuses longer)

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        if self.max_input_tokens is not None:
            _count(self.max_input_tokens, "max_input_tokens", minimum=1)
        _ident(self.gpu, "gpu")
        _ident(self.model, "model")
        _count(self.kv_capacity_tokens, "kv_capacity_tokens", minimum=1)
        _count(self.max_running, "max_running", minimum=1)
        _opt_str(self.http_url, "http_url")
        for name in ("nonce", "challenge", "proof"):
            _opt_hex(getattr(self, name), name)
        if self.incarnation is not None:
            _ident(self.incarnation, "incarnation")
        if self.role not in WORKER_ROLES:
            raise ProtocolError("role", f"must be one of {', '.join(WORKER_ROLES)}, got {self.role!r}")
        if self.bootstrap_port is not None and not 0 < _count(self.bootstrap_port, "bootstrap_port") < 65536:
            raise ProtocolError("bootstrap_port", f"must be a TCP port, got {self.bootstrap_port}")
        if self.role == "prefill" and self.bootstrap_port is None:
            raise ProtocolError("bootstrap_port", "a prefill worker must announce its bootstrap port")
        if self.tier_ms is not None:
            _set(self, "tier_ms", _rate(self.tier_ms, "tier_ms"))
        if _rate(self.time_scale, "time_scale") < 1.0:
            raise ProtocolError("time_scale", f"must be >= 1, got {self.time_scale}")
        _set(self, "time_scale", float(self.time_scale))


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Proof of life, and of progress: the engine's step counter stops while its engine hangs."""

    TYPE: ClassVar[str] = "heartbeat"
    worker_id: str
    seq: int
    engine_steps: int | None = None  # scheduling passes the engine has run (None: unknown yet)
    busy: bool = False  # the engine has work, so its steps must advance
    draining: bool = False  # shutting down gracefully: route nothing new here

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        _count(self.seq, "seq")
        if self.engine_steps is not None:
            _count(self.engine_steps, "engine_steps")
        _bool(self.busy, "busy")
        _bool(self.draining, "draining")


@dataclass(frozen=True, kw_only=True)
class LoadReport(Message):
    """The worker's measured state; the rates are EMAs (see WorkerView for their meaning)."""

    TYPE: ClassVar[str] = "load_report"
    worker_id: str
    seq: int
    queue_len: int
    running: int
    kv_used_tokens: int
    queue_delay_s: float
    prefill_s_per_token: float
    decode_s_per_token: float
    iteration_s: float
    tokens_per_minute: float
    # The router's requests the worker holds (None: more than MAX_INFLIGHT_LISTED), for the
    # router to reconcile lost Submits and lost final messages.
    inflight: tuple[str, ...] | None = None
    queue_drain_s: float | None = None  # predicted seconds until everything queued has started
    draining: bool = False

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        for name in ("seq", "queue_len", "running", "kv_used_tokens"):
            _count(getattr(self, name), name)
        for name in ("queue_delay_s", "prefill_s_per_token", "decode_s_per_token", "iteration_s", "tokens_per_minute"):
            _set(self, name, _rate(getattr(self, name), name))
        if self.inflight is not None:
            if not isinstance(self.inflight, (list, tuple)) or len(self.inflight) > MAX_INFLIGHT_LISTED:
                raise ProtocolError("inflight", f"must be a list of at most {MAX_INFLIGHT_LISTED} rids")
            _set(self, "inflight", tuple(_ident(rid, f"inflight[{i}]") for i, rid in enumerate(self.inflight)))
        if self.queue_drain_s is not None:
            _set(self, "queue_drain_s", _rate(self.queue_drain_s, "queue_drain_s"))
        _bool(self.draining, "draining")


@dataclass(frozen=True, kw_only=True)
class TokenChunk(Message):
    """New tokens of one request; the last chunk has finish_reason and the final meta_info."""

    TYPE: ClassVar[str] = "token_chunk"
    rid: str
    worker_id: str
    token_ids: tuple[int, ...]
    text: str | None = None  # detokenised delta, when the worker detokenises
    completion_tokens: int  # total generated so far, including resumed ones
    finish_reason: str | None = None
    meta: dict[str, Any] | None = None  # final meta_info, including the SLO report

    def __post_init__(self) -> None:
        _ident(self.rid, "rid")
        check_worker_id(self.worker_id)
        _set(self, "token_ids", _token_ids(self.token_ids, "token_ids"))
        _opt_str(self.text, "text")
        _count(self.completion_tokens, "completion_tokens")
        _opt_str(self.finish_reason, "finish_reason")
        if self.meta is not None:
            _obj(self.meta, "meta")


@dataclass(frozen=True, kw_only=True)
class RequestError(Message):
    TYPE: ClassVar[str] = "request_error"
    rid: str
    worker_id: str
    status: int  # HTTP-style: 4xx the request is bad, 5xx the worker failed (resubmittable)
    message: str
    # The worker shed it (scheduler/core/shed_wire.py keys: reason, retry_after_s, ...): the
    # router passes the answer on, and retries only a `draining` shed elsewhere.
    shed: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _ident(self.rid, "rid")
        check_worker_id(self.worker_id)
        if _count(self.status, "status") not in range(400, 600):
            raise ProtocolError("status", f"must be an HTTP error status 400..599, got {self.status}")
        _str(self.message, "message")
        if self.shed is not None and shed_from(_obj(self.shed, "shed")) is None:
            raise ProtocolError("shed.reason", "must be a shed reason (queue_full, slo_infeasible, ...)")


@dataclass(frozen=True, kw_only=True)
class FetchReply(Message):
    """A worker's answer to Fetch: its own HTTP server's response to the path."""

    TYPE: ClassVar[str] = "fetch_reply"
    worker_id: str
    fetch_id: str
    status: int
    content_type: str
    body: str

    def __post_init__(self) -> None:
        check_worker_id(self.worker_id)
        _hex(self.fetch_id, "fetch_id")
        if _count(self.status, "status") not in range(100, 600):
            raise ProtocolError("status", f"must be an HTTP status, got {self.status}")
        _str(self.content_type, "content_type")
        _str(self.body, "body")


# router -> worker


@dataclass(frozen=True, kw_only=True)
class Submit(Message):
    """Run a request; `resume_output_ids` are tokens already generated elsewhere (migration)."""

    TYPE: ClassVar[str] = "submit"
    rid: str
    input_ids: tuple[int, ...]
    sampling_params: dict[str, Any]
    slo: dict[str, Any] | None = None  # SloSpec.to_dict() form; re-validated with parse_slo
    resume_output_ids: tuple[int, ...] = ()
    stream: bool = True
    arrival_unix: float | None = None  # when the client's request reached the router (wall clock)
    # PD pairing: {"host", "port", "room"} of the prefill worker's KV bootstrap; the same Submit
    # (same room) goes to the prefill and the decode worker of the pair.
    bootstrap: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        _ident(self.rid, "rid")
        _set(self, "input_ids", _token_ids(self.input_ids, "input_ids", non_empty=True))
        _obj(self.sampling_params, "sampling_params")
        if self.slo is not None:
            try:
                parse_slo(self.slo, prefix="slo.")
            except SloValidationError as exc:
                raise ProtocolError(exc.field, exc.message) from None
        _set(self, "resume_output_ids", _token_ids(self.resume_output_ids, "resume_output_ids"))
        _bool(self.stream, "stream")
        if self.arrival_unix is not None:
            _set(self, "arrival_unix", _rate(self.arrival_unix, "arrival_unix"))
        if self.bootstrap is not None:
            _obj(self.bootstrap, "bootstrap")
            _ident(self.bootstrap.get("host"), "bootstrap.host")
            _count(self.bootstrap.get("port"), "bootstrap.port", minimum=1)
            _count(self.bootstrap.get("room"), "bootstrap.room")


@dataclass(frozen=True, kw_only=True)
class Abort(Message):
    TYPE: ClassVar[str] = "abort"
    rid: str

    def __post_init__(self) -> None:
        _ident(self.rid, "rid")


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """The answer to Register; an accepted one carries the router's proof when a worker secret
    is in use (the worker authenticates the router with it)."""

    TYPE: ClassVar[str] = "ack"
    accepted: bool
    reason: str = ""
    proof: str | None = None

    def __post_init__(self) -> None:
        _bool(self.accepted, "accepted")
        _str(self.reason, "reason")
        _opt_hex(self.proof, "proof")


@dataclass(frozen=True, kw_only=True)
class Challenge(Message):
    """The router's answer to a Register without proof: prove the worker secret over this nonce."""

    TYPE: ClassVar[str] = "challenge"
    nonce: str

    def __post_init__(self) -> None:
        _hex(self.nonce, "nonce")


@dataclass(frozen=True, kw_only=True)
class Sealed(Message):
    """A router -> worker message authenticated with the session's key: `body` is the inner
    message's wire form, `mac` its HMAC with the sequence number (which only ever grows)."""

    TYPE: ClassVar[str] = "sealed"
    seq: int
    mac: str
    body: str

    def __post_init__(self) -> None:
        _count(self.seq, "seq")
        _hex(self.mac, "mac")
        _str(self.body, "body")


@dataclass(frozen=True, kw_only=True)
class Fetch(Message):
    """Ask a worker for a GET/POST of its own HTTP server (model info, cache flush): the router
    never calls a URL a worker announced, nor sends it a client's credentials."""

    TYPE: ClassVar[str] = "fetch"
    fetch_id: str
    method: str
    path: str

    def __post_init__(self) -> None:
        _hex(self.fetch_id, "fetch_id")
        if self.method not in ("GET", "POST"):
            raise ProtocolError("method", f"must be GET or POST, got {self.method!r}")
        if self.path not in FETCH_PATHS:
            raise ProtocolError("path", f"must be one of {', '.join(FETCH_PATHS)}")


@dataclass(frozen=True, kw_only=True)
class Shutdown(Message):
    TYPE: ClassVar[str] = "shutdown"


FETCH_PATHS = ("/model_info", "/server_info", "/v1/models", "/flush_cache")
MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls
    for cls in (
        Register,
        Heartbeat,
        LoadReport,
        TokenChunk,
        RequestError,
        FetchReply,
        Submit,
        Abort,
        Ack,
        Challenge,
        Sealed,
        Fetch,
        Shutdown,
    )
}
_FIELD_NAMES: dict[type[Message], tuple[str, ...]] = {}
_REQUIRED: dict[type[Message], frozenset[str]] = {}


def _field_names(cls: type[Message]) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def _required(cls: type[Message]) -> frozenset[str]:
    req = _REQUIRED.get(cls)
    if req is None:
        req = _REQUIRED[cls] = frozenset(
            f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING
        )
    return req


def decode(raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Bytes -> Message. Raises ProtocolError, and nothing else, on any malformed input."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError("frame", f"must be bytes, got {_type_name(raw)}")
    if len(raw) > max_bytes:
        raise ProtocolError("frame", f"{len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("frame", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("frame", f"must be a JSON object, got {_type_name(data)}")
    version = data.get("version")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"must be {PROTOCOL_VERSION}, got {version!r}")
    kind = data.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("type", f"unknown message type {kind!r}")
    names = _field_names(cls)
    for key in data:
        if key not in names and key not in ("type", "version"):
            raise ProtocolError(key, f"unknown field for {kind}")
    for name in names:
        if name in _required(cls) and name not in data:
            raise ProtocolError(name, f"missing (required by {kind})")
    kwargs = {name: data[name] for name in names if name in data}  # a null is judged by the field's check
    try:
        return cls(**kwargs)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - the contract is ProtocolError only
        raise ProtocolError("frame", f"invalid {kind}: {exc}") from None


# --- views for the policies ---


def register_to_view(
    reg: Register, now: float, tier: float | None = None, *, healthy: bool = True, inflight: int = 0
) -> WorkerView:
    """A worker that has not reported yet: its capacity, no measured load."""
    return WorkerView(
        worker_id=reg.worker_id,
        gpu=reg.gpu,
        kv_capacity_tokens=reg.kv_capacity_tokens,
        max_running=reg.max_running,
        inflight=inflight,
        tpot_tier_ms=tier,
        role=reg.role,
        healthy=healthy,
        last_report_s=now,
    )


def load_report_to_view(
    report: LoadReport,
    inflight: int,
    now: float,
    tier: float | None = None,
    *,
    registration: Register,
    healthy: bool = True,
) -> WorkerView:
    """The report's measurements over the registration's capacity (the report omits static facts)."""
    if report.worker_id != registration.worker_id:
        raise ProtocolError(
            "worker_id", f"report from {report.worker_id!r}, registration of {registration.worker_id!r}"
        )
    return WorkerView(
        worker_id=report.worker_id,
        gpu=registration.gpu,
        kv_capacity_tokens=registration.kv_capacity_tokens,
        max_running=registration.max_running,
        queue_len=report.queue_len,
        running=report.running,
        kv_used_tokens=report.kv_used_tokens,
        queue_delay_s=report.queue_delay_s,
        prefill_s_per_token=report.prefill_s_per_token,
        decode_s_per_token=report.decode_s_per_token,
        iteration_s=report.iteration_s,
        tokens_per_minute=report.tokens_per_minute,
        inflight=inflight,
        tpot_tier_ms=tier,
        role=registration.role,
        healthy=healthy,
        last_report_s=now,
        queue_drain_s=report.queue_drain_s,
    )
