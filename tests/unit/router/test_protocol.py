"""Router wire format: every message round-trips, every malformed frame raises ProtocolError
naming the bad field (and nothing else), and load reports map onto WorkerView."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import orjson
import pytest

from router.protocol import (
    MAX_MESSAGE_BYTES,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Abort,
    Ack,
    Challenge,
    Fetch,
    FetchReply,
    Heartbeat,
    LoadReport,
    Message,
    ProtocolError,
    Register,
    RequestError,
    Sealed,
    Shutdown,
    Submit,
    TokenChunk,
    decode,
)
from router.report_views import load_report_to_view, register_to_view

NONCE = "ab" * 16

REGISTER = Register(
    worker_id="w0",
    gpu="h100",
    model="qwen-7b",
    kv_capacity_tokens=200_000,
    max_running=64,
    http_url="http://127.0.0.1:30000",
    nonce=NONCE,
    challenge="cd" * 16,
    proof="ef" * 32,
    max_input_tokens=8191,
)
REPORT = LoadReport(
    worker_id="w0",
    seq=7,
    queue_len=3,
    running=12,
    kv_used_tokens=50_000,
    queue_delay_s=0.12,
    prefill_s_per_token=2e-4,
    decode_s_per_token=0.02,
    iteration_s=0.025,
    tokens_per_minute=90_000,
)
SUBMIT = Submit(
    rid="r1",
    input_ids=[1, 2, 3],
    sampling_params={"max_new_tokens": 16, "temperature": 0.0},
    slo={"class": "latency", "ttft_ms": 500.0, "tpot_ms": 50.0, "weight": 1.0},
    resume_output_ids=[9, 10],
    stream=True,
)
MESSAGES: list[Message] = [
    REGISTER,
    Register(worker_id="w1", gpu="a40", model="m", kv_capacity_tokens=1, max_running=1),
    Heartbeat(worker_id="w0", seq=0),
    Heartbeat(worker_id="w0", seq=1, engine_steps=77, busy=True, draining=True),
    REPORT,
    LoadReport(
        **{**REPORT.__dict__, "inflight": ("r1", "r2"), "queue_drain_s": 2.5, "decode_step_s": 0.014, "draining": True}
    ),
    TokenChunk(rid="r1", worker_id="w0", token_ids=[5, 6], text="hi", completion_tokens=2),
    TokenChunk(
        rid="r1",
        worker_id="w0",
        token_ids=[],
        completion_tokens=2,
        finish_reason="stop",
        meta={"slo": {"met": True}, "completion_tokens": 2},
    ),
    RequestError(rid="r1", worker_id="w0", status=503, message="out of memory"),
    RequestError(
        rid="r1", worker_id="w0", status=429, message="full", shed={"reason": "queue_full", "retry_after_s": 2}
    ),
    FetchReply(worker_id="w0", fetch_id=NONCE, status=200, content_type="application/json", body="{}"),
    SUBMIT,
    Submit(rid="r2", input_ids=[0], sampling_params={}),
    Abort(rid="r1"),
    Ack(accepted=True),
    Ack(accepted=False, reason="wrong worker secret"),
    Ack(accepted=True, proof="01" * 32),
    Challenge(nonce=NONCE),
    Sealed(seq=3, mac="02" * 32, body='{"type": "abort"}'),
    Fetch(fetch_id=NONCE, method="GET", path="/model_info"),
    Shutdown(),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg: Message) -> None:
    raw = msg.to_wire()
    assert decode(raw) == msg
    data = orjson.loads(raw)
    assert data["type"] == msg.TYPE and data["version"] == PROTOCOL_VERSION


def test_every_type_is_covered() -> None:
    assert {type(m) for m in MESSAGES} == set(MESSAGE_TYPES.values())


def test_token_lists_become_tuples_and_floats_floats() -> None:
    assert SUBMIT.input_ids == (1, 2, 3) and SUBMIT.resume_output_ids == (9, 10)
    assert isinstance(REPORT.tokens_per_minute, float)


def _wire(msg: Message, **changes: Any) -> dict[str, Any]:
    data = orjson.loads(msg.to_wire())
    data.update(changes)
    return data


def _without(msg: Message, key: str) -> dict[str, Any]:
    data = orjson.loads(msg.to_wire())
    del data[key]
    return data


MALFORMED: list[tuple[str, Any, str]] = [
    ("not json", b"{not json", "frame"),
    ("nan literal", b'{"type": "heartbeat", "version": 1, "worker_id": "w0", "seq": NaN}', "frame"),
    ("float overflow", b'{"type": "load_report", "version": 1, "queue_delay_s": 1e400}', "frame"),
    ("not an object", b"[1, 2, 3]", "frame"),
    ("not bytes", "a str", "frame"),
    ("oversized", b'{"pad": "' + b"x" * MAX_MESSAGE_BYTES + b'"}', "frame"),
    ("unknown type", {"type": "teleport", "version": PROTOCOL_VERSION}, "type"),
    ("type not a string", {"type": 3, "version": PROTOCOL_VERSION}, "type"),
    ("wrong version", _wire(REPORT, version=PROTOCOL_VERSION + 1), "version"),
    ("missing version", _without(REPORT, "version"), "version"),
    ("bool version", _wire(REPORT, version=True), "version"),
    ("unknown field", _wire(REPORT, extra=1), "extra"),
    ("missing field", _without(REPORT, "queue_len"), "queue_len"),
    ("missing worker_id", _without(REGISTER, "worker_id"), "worker_id"),
    ("null required field", _wire(REPORT, seq=None), "seq"),
    ("count is a string", _wire(REPORT, running="12"), "running"),
    ("count is a float", _wire(REPORT, kv_used_tokens=1.5), "kv_used_tokens"),
    ("count is a bool", _wire(REPORT, queue_len=True), "queue_len"),
    (
        "count beyond 64 bits",
        b'{"type": "heartbeat", "version": 1, "worker_id": "w0", "seq": 1' + b"0" * 25 + b"}",
        "seq",
    ),
    ("negative count", _wire(REPORT, queue_len=-1), "queue_len"),
    ("negative seq", _wire(Heartbeat(worker_id="w0", seq=1), seq=-3), "seq"),
    ("zero capacity", _wire(REGISTER, kv_capacity_tokens=0), "kv_capacity_tokens"),
    ("negative rate", _wire(REPORT, decode_s_per_token=-0.1), "decode_s_per_token"),
    ("negative decode step", _wire(REPORT, decode_step_s=-0.01), "decode_step_s"),
    ("nan rate (encodes as null)", _wire(REPORT, queue_delay_s=math.nan), "queue_delay_s"),
    ("inf rate (encodes as null)", _wire(REPORT, iteration_s=math.inf), "iteration_s"),
    ("rate is a string", _wire(REPORT, tokens_per_minute="fast"), "tokens_per_minute"),
    ("empty worker_id", _wire(REPORT, worker_id=""), "worker_id"),
    ("worker_id bad chars", _wire(REPORT, worker_id="w 0\x00"), "worker_id"),
    ("worker_id too long", _wire(REPORT, worker_id="w" * 129), "worker_id"),
    ("rid not a string", _wire(Abort(rid="r"), rid=7), "rid"),
    ("token id is a string", _wire(SUBMIT, input_ids=[1, "2", 3]), "input_ids[1]"),
    ("token id is a float", _wire(SUBMIT, input_ids=[1, 2.0]), "input_ids[1]"),
    ("token id is negative", _wire(SUBMIT, resume_output_ids=[4, -1]), "resume_output_ids[1]"),
    ("token id is a bool", _wire(SUBMIT, input_ids=[True]), "input_ids[0]"),
    ("token id too large", _wire(SUBMIT, input_ids=[2**40]), "input_ids[0]"),
    ("token ids not a list", _wire(SUBMIT, input_ids="1 2 3"), "input_ids"),
    ("empty prompt", _wire(SUBMIT, input_ids=[]), "input_ids"),
    ("chunk token ids", _wire(MESSAGES[6], token_ids=[1, None]), "token_ids[1]"),
    ("sampling params not a dict", _wire(SUBMIT, sampling_params=[1]), "sampling_params"),
    ("bad slo", _wire(SUBMIT, slo={"class": "latency", "ttft_ms": -5}), "slo.ttft_ms"),
    ("slo not an object", _wire(SUBMIT, slo="fast"), "slo"),
    ("stream not a bool", _wire(SUBMIT, stream=1), "stream"),
    ("meta not an object", _wire(MESSAGES[7], meta=[1]), "meta"),
    ("finish reason not a string", _wire(MESSAGES[7], finish_reason=1), "finish_reason"),
    ("status not an error", _wire(MESSAGES[8], status=200), "status"),
    ("shed without a known reason", _wire(MESSAGES[8], shed={"reason": "bored"}), "shed.reason"),
    ("nonce not hex", _wire(REGISTER, nonce="not hex at all, but long enough ok"), "nonce"),
    ("proof too short", _wire(REGISTER, proof="ab"), "proof"),
    ("challenge nonce missing", {"type": "challenge", "version": PROTOCOL_VERSION}, "nonce"),
    ("fetch of another path", _wire(Fetch(fetch_id=NONCE, method="GET", path="/v1/models"), path="/admin"), "path"),
    (
        "fetch with a bad method",
        _wire(Fetch(fetch_id=NONCE, method="GET", path="/v1/models"), method="DELETE"),
        "method",
    ),
    ("inflight not a list", _wire(REPORT, inflight="r1"), "inflight"),
    ("inflight rid empty", _wire(REPORT, inflight=["r1", ""]), "inflight[1]"),
    ("engine steps negative", _wire(Heartbeat(worker_id="w0", seq=1), engine_steps=-1), "engine_steps"),
    ("zero max input", _wire(REGISTER, max_input_tokens=0), "max_input_tokens"),
    ("accepted not a bool", _wire(Ack(accepted=True), accepted="yes"), "accepted"),
    ("http_url not a string", _wire(REGISTER, http_url=80), "http_url"),
    ("unknown role", _wire(REGISTER, role="both"), "role"),
    ("prefill without a bootstrap port", _wire(REGISTER, role="prefill"), "bootstrap_port"),
    ("bootstrap port out of range", _wire(REGISTER, role="prefill", bootstrap_port=70000), "bootstrap_port"),
    ("negative tier", _wire(REGISTER, tier_ms=-5), "tier_ms"),
    ("slo_levers not a boolean", _wire(REGISTER, slo_levers="yes"), "slo_levers"),
    ("bootstrap not an object", _wire(SUBMIT, bootstrap=[1]), "bootstrap"),
    ("bootstrap without a room", _wire(SUBMIT, bootstrap={"host": "h", "port": 1}), "bootstrap.room"),
    ("bootstrap port a string", _wire(SUBMIT, bootstrap={"host": "h", "port": "1", "room": 2}), "bootstrap.port"),
]


def test_pd_fields_round_trip() -> None:
    reg = Register(**{**REGISTER.__dict__, "role": "prefill", "bootstrap_port": 8998, "tier_ms": 50})
    assert decode(reg.to_wire()) == reg and reg.tier_ms == 50.0
    sub = Submit(**{**SUBMIT.__dict__, "bootstrap": {"host": "127.0.0.1", "port": 8998, "room": 2**62}})
    assert decode(sub.to_wire()) == sub


@pytest.mark.parametrize(("raw", "field"), [(r, f) for _, r, f in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_malformed_raises_protocol_error_naming_field(raw: Any, field: str) -> None:
    if isinstance(raw, dict):
        raw = orjson.dumps(raw)
    with pytest.raises(ProtocolError) as info:
        decode(raw)
    assert info.value.field == field, info.value
    assert isinstance(info.value, ValueError)


def test_max_bytes_is_configurable() -> None:
    raw = REPORT.to_wire()
    with pytest.raises(ProtocolError, match="limit") as info:
        decode(raw, max_bytes=len(raw) - 1)
    assert info.value.field == "frame"
    assert decode(raw, max_bytes=len(raw)) == REPORT


def test_construction_validates_too() -> None:
    with pytest.raises(ProtocolError) as info:
        LoadReport(**{**REPORT.__dict__, "queue_delay_s": math.nan})
    assert info.value.field == "queue_delay_s"
    with pytest.raises(ProtocolError) as info:
        Submit(rid="r", input_ids=[1], sampling_params={}, slo={"tpot_ms": 20})
    assert info.value.field == "slo.ttft_ms"


def test_oversized_or_unserialisable_message_refused_on_send() -> None:
    with pytest.raises(ProtocolError) as info:
        Submit(rid="r", input_ids=[1] * (MAX_MESSAGE_BYTES // 2), sampling_params={}).to_wire()
    assert info.value.field == "frame"
    with pytest.raises(ProtocolError):
        TokenChunk(rid="r", worker_id="w0", token_ids=[], completion_tokens=0, meta={"x": object()}).to_wire()


def test_long_prompt_decodes() -> None:
    msg = Submit(rid="r", input_ids=list(range(100_000)), sampling_params={})
    assert decode(msg.to_wire()).input_ids == tuple(range(100_000))


def test_load_report_to_view_maps_fields() -> None:
    view = load_report_to_view(REPORT, 5, 123.0, 50.0, registration=REGISTER)
    assert (view.worker_id, view.gpu, view.kv_capacity_tokens, view.max_running) == ("w0", "h100", 200_000, 64)
    for name in (
        "queue_len",
        "running",
        "kv_used_tokens",
        "queue_delay_s",
        "prefill_s_per_token",
        "decode_s_per_token",
        "iteration_s",
        "tokens_per_minute",
    ):
        assert getattr(view, name) == getattr(REPORT, name), name
    assert view.inflight == 5 and view.last_report_s == 123.0 and view.tpot_tier_ms == 50.0 and view.healthy
    assert view.kv_free_tokens == 150_000 and view.load == 15
    assert view.decode_step_s == 0.0  # not reported
    stepped = load_report_to_view(replace(REPORT, decode_step_s=0.014), 5, 123.0, registration=REGISTER)
    assert stepped.decode_step_s == 0.014
    assert not view.slo_levers  # a stock engine, as registered
    levered = replace(REGISTER, slo_levers=True)
    assert load_report_to_view(REPORT, 5, 123.0, registration=levered).slo_levers
    assert register_to_view(levered, 10.0).slo_levers


def test_load_report_to_view_refuses_mismatched_registration() -> None:
    other = Register(worker_id="w9", gpu="a40", model="m", kv_capacity_tokens=1, max_running=1)
    with pytest.raises(ProtocolError) as info:
        load_report_to_view(REPORT, 0, 0.0, registration=other)
    assert info.value.field == "worker_id"


def test_register_to_view_has_capacity_and_no_load() -> None:
    view = register_to_view(REGISTER, 10.0)
    assert (view.gpu, view.kv_capacity_tokens, view.max_running) == ("h100", 200_000, 64)
    assert view.load == 0 and view.healthy and view.last_report_s == 10.0 and view.tpot_tier_ms is None
