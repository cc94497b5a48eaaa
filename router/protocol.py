"""Router <-> worker wire format: one orjson object per ZMQ frame, tagged with `type` and `version`.

Both ends validate every field (at construction and in `decode`), so a bug or a stray peer shows
up as a `ProtocolError` naming the bad field instead of a KeyError deep in the router. Messages
are frozen dataclasses; `decode` is the only way bytes become a message.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, fields
from typing import Any, ClassVar

import orjson

from router.protocol_fields import (
    Check,
    at_least,
    boolean,
    count,
    hex_digits,
    ident,
    int_in,
    non_empty_tokens,
    obj,
    one_of,
    opt_str,
    optional,
    rate,
    rate_at_least,
    string,
    token_ids,
    type_name,
)
from router.protocol_fields import ProtocolError as ProtocolError  # every decode error: the protocol's API
from router.protocol_fields import check_worker_id as check_worker_id  # the worker-id rule, for the CLIs
from scheduler.core.shed_wire import shed_from
from scheduler.core.slo import SloSpec, SloValidationError, parse_slo

PROTOCOL_VERSION = 1
WORKER_ROLES = ("mixed", "prefill", "decode")
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # a 128k-token prompt plus resume ids is ~2 MiB of JSON
MAX_INFLIGHT_LISTED = 4096  # rids a LoadReport lists (more: the router skips reconciliation)


# --- checks of this protocol's own compound fields (the generic ones: router/protocol_fields.py) ---


def _rid_list(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, (list, tuple)) or len(value) > MAX_INFLIGHT_LISTED:
        raise ProtocolError(name, f"must be a list of at most {MAX_INFLIGHT_LISTED} rids")
    return tuple(ident(rid, f"{name}[{i}]") for i, rid in enumerate(value))


def _shed(value: Any, name: str) -> dict[str, Any]:
    if shed_from(obj(value, name)) is None:
        raise ProtocolError(f"{name}.reason", "must be a shed reason (queue_full, slo_infeasible, ...)")
    return value


def _slo(value: Any, name: str) -> SloSpec:
    if isinstance(value, SloSpec):
        return value  # the router's own: parse_slo validated it at the router's HTTP edge
    try:
        return parse_slo(value, prefix=f"{name}.")
    except SloValidationError as exc:
        raise ProtocolError(exc.field, exc.message) from None


def _bootstrap(value: Any, name: str) -> dict[str, Any]:
    obj(value, name)
    ident(value.get("host"), f"{name}.host")
    count(value.get("port"), f"{name}.port", minimum=1)
    count(value.get("room"), f"{name}.room")
    return value


# --- messages ---


@dataclass(frozen=True, kw_only=True)
class Message:
    """Base of every wire message; a subclass sets TYPE and its table of field checks (`CHECKS`,
    run in order at construction, each value replaced by its normalised form)."""

    TYPE: ClassVar[str] = ""
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = ()

    def __post_init__(self) -> None:
        for name, check in self.CHECKS:
            object.__setattr__(self, name, check(getattr(self, name), name))  # frozen: normalise in place
        self._check_together()

    def _check_together(self) -> None:
        """Rules across fields, after each field passed its own check."""

    def to_wire(self) -> bytes:
        """orjson bytes; None-valued optional fields are left out (decode restores them)."""
        payload: dict[str, Any] = {"type": self.TYPE, "version": PROTOCOL_VERSION}
        for name in _FIELD_NAMES[type(self)]:
            value = getattr(self, name)
            if value is not None:
                payload[name] = value.to_dict() if isinstance(value, SloSpec) else value
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
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("worker_id", check_worker_id),
        ("max_input_tokens", optional(at_least(1))),
        ("gpu", ident),
        ("model", ident),
        ("kv_capacity_tokens", at_least(1)),
        ("max_running", at_least(1)),
        ("http_url", opt_str),
        ("nonce", optional(hex_digits)),
        ("challenge", optional(hex_digits)),
        ("proof", optional(hex_digits)),
        ("incarnation", optional(ident)),
        ("role", one_of(WORKER_ROLES, f"one of {', '.join(WORKER_ROLES)}")),
        ("bootstrap_port", optional(int_in(1, 65536, "a TCP port"))),
        ("tier_ms", optional(rate)),
        ("time_scale", rate_at_least(1.0)),
        ("slo_levers", boolean),
    )
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
    # Its engine sizes each step to the tightest resident's TPOT (the SLO levers): prefill yields
    # to decode, so a tier is kept by its plain decode step, not by the measured mixed steps.
    slo_levers: bool = False

    def _check_together(self) -> None:
        if self.role == "prefill" and self.bootstrap_port is None:
            raise ProtocolError("bootstrap_port", "a prefill worker must announce its bootstrap port")


@dataclass(frozen=True, kw_only=True)
class Heartbeat(Message):
    """Proof of life, and of progress: the engine's step counter stops while its engine hangs."""

    TYPE: ClassVar[str] = "heartbeat"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("worker_id", check_worker_id),
        ("seq", count),
        ("engine_steps", optional(count)),
        ("busy", boolean),
        ("draining", boolean),
    )
    worker_id: str
    seq: int
    engine_steps: int | None = None  # scheduling passes the engine has run (None: unknown yet)
    busy: bool = False  # the engine has work, so its steps must advance
    draining: bool = False  # shutting down gracefully: route nothing new here


@dataclass(frozen=True, kw_only=True)
class LoadReport(Message):
    """The worker's measured state; the rates are EMAs (see WorkerView for their meaning)."""

    TYPE: ClassVar[str] = "load_report"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("worker_id", check_worker_id),
        *((name, count) for name in ("seq", "queue_len", "running", "kv_used_tokens")),
        *(
            (name, rate)
            for name in (
                "queue_delay_s",
                "prefill_s_per_token",
                "decode_s_per_token",
                "iteration_s",
                "tokens_per_minute",
            )
        ),
        ("inflight", optional(_rid_list)),
        ("queue_drain_s", optional(rate)),
        ("decode_step_s", optional(rate)),
        ("draining", boolean),
    )
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
    decode_step_s: float | None = None  # the engine's predicted plain decode step now (WorkerView)
    draining: bool = False


@dataclass(frozen=True, kw_only=True)
class TokenChunk(Message):
    """New tokens of one request; the last chunk has finish_reason and the final meta_info."""

    TYPE: ClassVar[str] = "token_chunk"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("rid", ident),
        ("worker_id", check_worker_id),
        ("token_ids", token_ids),
        ("text", opt_str),
        ("completion_tokens", count),
        ("finish_reason", opt_str),
        ("meta", optional(obj)),
    )
    rid: str
    worker_id: str
    token_ids: tuple[int, ...]
    text: str | None = None  # detokenised delta, when the worker detokenises
    completion_tokens: int  # total generated so far, including resumed ones
    finish_reason: str | None = None
    meta: dict[str, Any] | None = None  # final meta_info, including the SLO report


@dataclass(frozen=True, kw_only=True)
class RequestError(Message):
    TYPE: ClassVar[str] = "request_error"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("rid", ident),
        ("worker_id", check_worker_id),
        ("status", int_in(400, 600, "an HTTP error status 400..599")),
        ("message", string),
        ("shed", optional(_shed)),
    )
    rid: str
    worker_id: str
    status: int  # HTTP-style: 4xx the request is bad, 5xx the worker failed (resubmittable)
    message: str
    # The worker shed it (scheduler/core/shed_wire.py keys: reason, retry_after_s, ...): the
    # router passes the answer on, and retries only a `draining` shed elsewhere.
    shed: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class FetchReply(Message):
    """A worker's answer to Fetch: its own HTTP server's response to the path."""

    TYPE: ClassVar[str] = "fetch_reply"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("worker_id", check_worker_id),
        ("fetch_id", hex_digits),
        ("status", int_in(100, 600, "an HTTP status")),
        ("content_type", string),
        ("body", string),
    )
    worker_id: str
    fetch_id: str
    status: int
    content_type: str
    body: str


# router -> worker


@dataclass(frozen=True, kw_only=True)
class Submit(Message):
    """Run a request; `resume_output_ids` are tokens already generated elsewhere (migration)."""

    TYPE: ClassVar[str] = "submit"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("rid", ident),
        ("input_ids", non_empty_tokens),
        ("sampling_params", obj),
        ("slo", optional(_slo)),
        ("resume_output_ids", token_ids),
        ("stream", boolean),
        ("arrival_unix", optional(rate)),
        ("bootstrap", optional(_bootstrap)),
    )
    rid: str
    input_ids: tuple[int, ...]
    sampling_params: dict[str, Any]
    slo: SloSpec | None = None  # on the wire as SloSpec.to_dict(); a worker decodes it with parse_slo
    resume_output_ids: tuple[int, ...] = ()
    stream: bool = True
    arrival_unix: float | None = None  # when the client's request reached the router (wall clock)
    # PD pairing: {"host", "port", "room"} of the prefill worker's KV bootstrap; the same Submit
    # (same room) goes to the prefill and the decode worker of the pair.
    bootstrap: dict[str, Any] | None = None


@dataclass(frozen=True, kw_only=True)
class Abort(Message):
    TYPE: ClassVar[str] = "abort"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (("rid", ident),)
    rid: str


@dataclass(frozen=True, kw_only=True)
class Ack(Message):
    """The answer to Register; an accepted one carries the router's proof when a worker secret
    is in use (the worker authenticates the router with it)."""

    TYPE: ClassVar[str] = "ack"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("accepted", boolean),
        ("reason", string),
        ("proof", optional(hex_digits)),
    )
    accepted: bool
    reason: str = ""
    proof: str | None = None


@dataclass(frozen=True, kw_only=True)
class Challenge(Message):
    """The router's answer to a Register without proof: prove the worker secret over this nonce."""

    TYPE: ClassVar[str] = "challenge"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (("nonce", hex_digits),)
    nonce: str


@dataclass(frozen=True, kw_only=True)
class Sealed(Message):
    """A router -> worker message authenticated with the session's key: `body` is the inner
    message's wire form, `mac` its HMAC with the sequence number (which only ever grows)."""

    TYPE: ClassVar[str] = "sealed"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (("seq", count), ("mac", hex_digits), ("body", string))
    seq: int
    mac: str
    body: str


FETCH_PATHS = ("/model_info", "/server_info", "/v1/models", "/flush_cache")


@dataclass(frozen=True, kw_only=True)
class Fetch(Message):
    """Ask a worker for a GET/POST of its own HTTP server (model info, cache flush): the router
    never calls a URL a worker announced, nor sends it a client's credentials."""

    TYPE: ClassVar[str] = "fetch"
    CHECKS: ClassVar[tuple[tuple[str, Check], ...]] = (
        ("fetch_id", hex_digits),
        ("method", one_of(("GET", "POST"), "GET or POST")),
        ("path", one_of(FETCH_PATHS, f"one of {', '.join(FETCH_PATHS)}", show_value=False)),
    )
    fetch_id: str
    method: str
    path: str


@dataclass(frozen=True, kw_only=True)
class Shutdown(Message):
    TYPE: ClassVar[str] = "shutdown"


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


_FIELD_NAMES = {cls: tuple(f.name for f in fields(cls)) for cls in MESSAGE_TYPES.values()}
_REQUIRED = {
    cls: frozenset(f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING)
    for cls in MESSAGE_TYPES.values()
}


def decode(raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Bytes -> Message. Raises ProtocolError, and nothing else, on any malformed input."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise ProtocolError("frame", f"must be bytes, got {type_name(raw)}")
    if len(raw) > max_bytes:
        raise ProtocolError("frame", f"{len(raw)} bytes exceeds the {max_bytes}-byte limit")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError("frame", f"not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ProtocolError("frame", f"must be a JSON object, got {type_name(data)}")
    version = data.get("version")
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise ProtocolError("version", f"must be {PROTOCOL_VERSION}, got {version!r}")
    kind = data.get("type")
    cls = MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError("type", f"unknown message type {kind!r}")
    names = _FIELD_NAMES[cls]
    for key in data:
        if key not in names and key not in ("type", "version"):
            raise ProtocolError(key, f"unknown field for {kind}")
    for name in names:
        if name in _REQUIRED[cls] and name not in data:
            raise ProtocolError(name, f"missing (required by {kind})")
    kwargs = {name: data[name] for name in names if name in data}  # a null is judged by the field's check
    try:
        return cls(**kwargs)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - the contract is ProtocolError only
        raise ProtocolError("frame", f"invalid {kind}: {exc}") from None
