"""Public LLM-serving traces as one request type, for the goodput benchmark harness.

Every dataset in ``shared/data`` has its own format and units. Each is read here into a list of
``TraceRequest`` so the harness and the shaping helpers (``window``, ``scale_rate``,
``poisson_arrivals``, ``limit``) only ever see one shape. Loaders never raise on a bad row:
they return it in ``TraceLoad.bad_rows`` with a reason, so a replay can say what it skipped.

Programs (multi-stage jobs, agent sessions) are a DAG: a request with ``parents`` must be sent
``think_s`` after all its parents have finished. Its ``arrival_s`` is its program's arrival,
the earliest it could possibly be sent; the real send time depends on the server under test.

The data is never copied into the repository. The data directory is, in order: the
``data_dir`` argument, ``$SGLANG_SLO_DATA``, or ``<repo>/../shared/data``.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

DATA_ENV = "SGLANG_SLO_DATA"
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "data"
MOONCAKE_BLOCK_TOKENS = 512


@dataclass(frozen=True, kw_only=True)
class TraceRequest:
    """One LLM call of a trace, in the units the harness uses (seconds, tokens)."""

    arrival_s: float  # seconds from the trace's first request; for a DAG stage, its program's arrival
    prompt_tokens: int
    output_tokens: int
    prefix_hash_ids: tuple[int, ...] = ()  # Mooncake 512-token block hashes: a shared leading run = shared KV prefix
    program_id: str | None = None
    stage: int | None = None
    parents: tuple[str, ...] = ()  # rids that must finish before this one is sent
    think_s: float = 0.0  # tool/user wait after the last parent finishes, before this is sent
    prefix_tokens: int = 0  # leading prompt tokens reused from the previous call's context (agent traces)
    rid: str


@dataclass
class TraceLoad:
    """A loader's result: the good requests, and every rejected row with its reason."""

    requests: list[TraceRequest]
    bad_rows: list[tuple[int | str, str]] = field(default_factory=list)


class _BadRow(ValueError):
    """A row cannot become a request; the message is the reason recorded in ``bad_rows``."""


# --------------------------------------------------------------------------------------------
# Data directory and the registry of bundled traces


def resolve_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The argument wins, then ``$SGLANG_SLO_DATA``, then ``../shared/data`` next to the repo."""
    if data_dir is not None:
        return Path(data_dir)
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else DEFAULT_DATA_DIR


# --------------------------------------------------------------------------------------------
# Field validation: every loader funnels values through these, so every dataset rejects the same things.


def _number(value: Any, key: str) -> int | float:
    """A finite non-negative number from JSON or CSV text; anything else is a bad row."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _BadRow(f"missing {key}")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _BadRow(f"{key} is not a number: {value!r}")
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise _BadRow(f"{key} is not a number: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadRow(f"{key} is not finite: {value!r}")
    if value < 0:
        raise _BadRow(f"{key} is negative: {value!r}")
    return value


def _count(value: Any, key: str) -> int:
    """A non-negative integer (token count, index); 12.0 is accepted, 12.5 is not."""
    number = _number(value, key)
    if isinstance(number, float):
        if not number.is_integer():
            raise _BadRow(f"{key} is not an integer: {number!r}")
        number = int(number)
    return number


def _prompt(value: Any, key: str) -> int:
    """A prompt length: a request with no prompt tokens cannot be sent."""
    n = _count(value, key)
    if n == 0:
        raise _BadRow(f"{key} is zero")
    return n


def _json_object(line: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise _BadRow(f"invalid JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise _BadRow("not a JSON object")
    return obj


def _jsonl_rows(path: Path, max_rows: int | None) -> Iterator[tuple[int, str]]:
    """(line number, text) of non-blank lines, streamed, at most ``max_rows`` of them."""
    with path.open(encoding="utf-8") as f:
        n = 0
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            if max_rows is not None and n >= max_rows:
                return
            n += 1
            yield lineno, line


def _csv_rows(
    path: Path, required: Sequence[str], max_rows: int | None, bad: list[tuple[int | str, str]]
) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) streamed; a header missing a column is one bad row and yields nothing."""
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            bad.append((1, f"header lacks column(s) {', '.join(missing)}"))
            return
        for n, row in enumerate(reader):
            if max_rows is not None and n >= max_rows:
                return
            yield reader.line_num, row


def _check_csv_shape(row: dict[str, Any]) -> None:
    """Too many fields means a stray comma: the values can no longer be trusted."""
    if None in row:
        raise _BadRow(f"extra fields: {row[None]!r}")


def _sorted(requests: list[TraceRequest]) -> list[TraceRequest]:
    """By arrival; stable, so a program's stages and equal-time rows keep file order."""
    return sorted(requests, key=lambda r: r.arrival_s)


def _check_max_rows(max_rows: int | None) -> None:
    if max_rows is not None and max_rows < 0:
        raise ValueError(f"max_rows must be >= 0, got {max_rows}")


# --------------------------------------------------------------------------------------------
# Azure LLM inference 2023 (Splitwise): TIMESTAMP, ContextTokens, GeneratedTokens

_AZURE_TS = re.compile(r"^(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d{1,9}))?$")
_EPOCH = datetime(1970, 1, 1)
_ONE_SECOND = timedelta(seconds=1)


def _azure_ns(text: Any) -> int:
    """Integer nanoseconds, so 7-digit fractions survive the subtraction of a 1.7e9 s epoch."""
    if not isinstance(text, str) or not text.strip():
        raise _BadRow("missing TIMESTAMP")
    m = _AZURE_TS.match(text.strip())
    if m is None:
        raise _BadRow(f"unparsable TIMESTAMP: {text!r}")
    try:
        base = datetime.strptime(f"{m[1]} {m[2]}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        raise _BadRow(f"unparsable TIMESTAMP: {text!r}") from None
    whole_s = (base - _EPOCH) // _ONE_SECOND
    return whole_s * 1_000_000_000 + int((m[3] or "0").ljust(9, "0"))


def load_azure(path: Path, max_rows: int | None = None) -> TraceLoad:
    """Azure LLM 2023 code or conversation CSV.

    ``TIMESTAMP`` is ``YYYY-MM-DD HH:MM:SS.fffffff`` with no time zone; only differences are used,
    re-based to the earliest valid row. rid is ``<file stem>:<line>``.
    """
    _check_max_rows(max_rows)
    bad: list[tuple[int | str, str]] = []
    parsed: list[tuple[int, int, int, int]] = []  # line, ns, prompt, output
    for lineno, row in _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"), max_rows, bad):
        try:
            _check_csv_shape(row)
            parsed.append(
                (
                    lineno,
                    _azure_ns(row["TIMESTAMP"]),
                    _prompt(row["ContextTokens"], "ContextTokens"),
                    _count(row["GeneratedTokens"], "GeneratedTokens"),
                )
            )
        except _BadRow as e:
            bad.append((lineno, str(e)))
    t0 = min((ns for _, ns, _, _ in parsed), default=0)
    requests = [
        TraceRequest(arrival_s=(ns - t0) / 1e9, prompt_tokens=p, output_tokens=o, rid=f"{path.stem}:{lineno}")
        for lineno, ns, p, o in parsed
    ]
    return TraceLoad(_sorted(requests), bad)


# --------------------------------------------------------------------------------------------
# Mooncake FAST'25: {"timestamp" (ms), "input_length", "output_length", "hash_ids"}


def _hash_ids(value: Any) -> tuple[int, ...]:
    if value is None:
        raise _BadRow("missing hash_ids")
    if not isinstance(value, list):
        raise _BadRow(f"hash_ids is not a list: {type(value).__name__}")
    return tuple(_count(v, "hash_ids[]") for v in value)


def load_mooncake(path: Path, max_rows: int | None = None) -> TraceLoad:
    """Mooncake conversation or synthetic JSONL.

    ``timestamp`` is ms from the trace start; it is re-based to the earliest valid row. Each
    ``hash_ids`` entry names one 512-token prompt block, comparable only within one file. The
    synthetic trace has multi-turn conversations but no conversation id, so there are no programs;
    the shared prefix shows only through ``prefix_hash_ids``. rid is ``<file stem>:<line>``.
    """
    _check_max_rows(max_rows)
    bad: list[tuple[int | str, str]] = []
    parsed: list[tuple[int, float, int, int, tuple[int, ...]]] = []
    for lineno, line in _jsonl_rows(path, max_rows):
        try:
            obj = _json_object(line)
            parsed.append(
                (
                    lineno,
                    float(_number(obj.get("timestamp"), "timestamp")),
                    _prompt(obj.get("input_length"), "input_length"),
                    _count(obj.get("output_length"), "output_length"),
                    _hash_ids(obj.get("hash_ids")),
                )
            )
        except _BadRow as e:
            bad.append((lineno, str(e)))
    t0 = min((ts for _, ts, _, _, _ in parsed), default=0.0)
    requests = [
        TraceRequest(
            arrival_s=(ts - t0) / 1000.0,
            prompt_tokens=p,
            output_tokens=o,
            prefix_hash_ids=h,
            rid=f"{path.stem}:{lineno}",
        )
        for lineno, ts, p, o, h in parsed
    ]
    return TraceLoad(_sorted(requests), bad)


# --------------------------------------------------------------------------------------------
# JITServe deep research: [{"request_id", "stages": [{"stage_number", "requests": [{input_tokens, ...}]}]}]


def _deepresearch_call(call: Any) -> tuple[int, int]:
    if not isinstance(call, dict):
        raise _BadRow("call is not a JSON object")
    prompt = _prompt(call.get("input_tokens"), "input_tokens")
    output = _count(call.get("output_tokens"), "output_tokens")
    if call.get("total_tokens") is not None and _count(call["total_tokens"], "total_tokens") != prompt + output:
        raise _BadRow(f"total_tokens {call['total_tokens']} != input_tokens + output_tokens {prompt + output}")
    return prompt, output


def _deepresearch_job(job: Any, index: int, arrival_s: float, bad: list[tuple[int | str, str]]) -> list[TraceRequest]:
    """One job's calls; a bad call is reported and the next stage depends on the stage's other calls."""
    if not isinstance(job, dict):
        bad.append((f"job[{index}]", "not a JSON object"))
        return []
    try:
        job_id = _count(job.get("request_id"), "request_id")
        stages = job.get("stages")
        if not isinstance(stages, list) or not stages:
            raise _BadRow("stages missing or empty")
    except _BadRow as e:
        bad.append((f"job[{index}]", str(e)))
        return []
    program = f"dr{job_id}"
    out: list[TraceRequest] = []
    parents: tuple[str, ...] = ()
    last_stage = -1
    for s_pos, stage in enumerate(stages):
        where = f"{program} stages[{s_pos}]"
        try:
            if not isinstance(stage, dict):
                raise _BadRow("stage is not a JSON object")
            number = _count(stage.get("stage_number"), "stage_number")
            if number <= last_stage:
                raise _BadRow(f"stage_number {number} does not follow {last_stage}")
            calls = stage.get("requests")
            if not isinstance(calls, list) or not calls:
                raise _BadRow("requests missing or empty")
        except _BadRow as e:
            bad.append((where, str(e)))
            continue
        last_stage = number
        kept: list[str] = []
        for c_pos, call in enumerate(calls):
            rid = f"{program}.s{number}.c{c_pos}"
            try:
                prompt, output = _deepresearch_call(call)
            except _BadRow as e:
                bad.append((rid, str(e)))
                continue
            out.append(
                TraceRequest(
                    arrival_s=arrival_s,
                    prompt_tokens=prompt,
                    output_tokens=output,
                    program_id=program,
                    stage=number,
                    parents=parents,
                    rid=rid,
                )
            )
            kept.append(rid)
        if kept:
            parents = tuple(kept)
    return out


def load_deepresearch(path: Path, max_rows: int | None = None, interval_s: float = 1.0) -> TraceLoad:
    """JITServe deep-research jobs: one program per job, one request per LLM call.

    Stage k+1 depends on every call of stage k (per the dataset README), so each call's
    ``parents`` are the rids of the previous stage's calls, and the calls within a stage run in
    parallel. The file has no times: the k-th job is placed at ``k * interval_s`` (a placeholder;
    use ``poisson_arrivals`` for a real load) and no tool/think time is known, so ``think_s`` is 0.
    ``max_rows`` counts jobs; the file is one JSON document (0.46 MB), read whole.
    rid is ``dr<request_id>.s<stage>.c<call>``, program_id ``dr<request_id>``.
    """
    _check_max_rows(max_rows)
    if not (math.isfinite(interval_s) and interval_s >= 0):
        raise ValueError(f"interval_s must be finite and >= 0, got {interval_s}")
    bad: list[tuple[int | str, str]] = []
    try:
        jobs = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        return TraceLoad([], [("file", f"invalid JSON: {e.msg} at line {e.lineno}")])
    if not isinstance(jobs, list):
        return TraceLoad([], [("file", "top level is not a JSON list of jobs")])
    requests: list[TraceRequest] = []
    kept_jobs = 0
    for index, job in enumerate(jobs[:max_rows] if max_rows is not None else jobs):
        calls = _deepresearch_job(job, index, kept_jobs * interval_s, bad)
        if calls:
            requests.extend(calls)
            kept_jobs += 1
    return TraceLoad(_sorted(requests), bad)


# --------------------------------------------------------------------------------------------
# TraceLab agent sessions: per-round JSONL (observed timings) and the replayer's session CSV


def _iso_ts(value: Any) -> float:
    """ISO-8601 (``...Z`` allowed, which Python 3.10 does not parse) to POSIX seconds."""
    if not isinstance(value, str) or not value:
        raise _BadRow(f"missing or non-string timestamp: {value!r}")
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        ts = datetime.fromisoformat(text)
    except ValueError:
        raise _BadRow(f"unparsable timestamp: {value!r}") from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=timezone.utc)
    return ts.timestamp()


_INPUT_EVENTS = frozenset({"user_message", "tool_result"})


def _round_times(events: Any) -> tuple[float, float]:
    """(sent, finished) of one round from its timing events.

    The call is sent when its last input (user message or tool result) is in; with none, at its
    first event. It has finished at its last event of any kind.
    """
    if not isinstance(events, list) or not events:
        raise _BadRow("timing_events missing or empty")
    times: list[tuple[float, bool]] = []
    for event in events:
        if not isinstance(event, dict):
            raise _BadRow("timing event is not a JSON object")
        times.append((_iso_ts(event.get("timestamp")), event.get("event_type") in _INPUT_EVENTS))
    inputs = [t for t, is_input in times if is_input]
    sent = max(inputs) if inputs else min(t for t, _ in times)
    return sent, max(t for t, _ in times)


@dataclass(frozen=True)
class _Round:
    """A validated agent round before it is chained to its session's previous round."""

    key: int | str
    session: str
    index: int
    prompt: int
    output: int
    prefix: int
    sent_s: float = 0.0
    finished_s: float = 0.0
    wait_after_s: float = 0.0
    session_arrival_s: float = 0.0


def _chain_sessions(
    rounds: list[_Round], prefix: str, observed: bool, bad: list[tuple[int | str, str]]
) -> list[TraceRequest]:
    """One program per session, each round depending on the session's previous kept round.

    ``observed``: think time is the gap between the previous round's finish and this round's send
    (real timings); otherwise it is the previous round's ``wait_after_s`` (replayer input).
    """
    sessions: dict[str, list[_Round]] = {}
    for r in rounds:
        sessions.setdefault(r.session, []).append(r)
    out: list[TraceRequest] = []
    for session, items in sessions.items():
        items.sort(key=lambda r: r.index)
        program = f"{prefix}{session}"
        prev: _Round | None = None
        for r in items:
            if prev is not None and r.index == prev.index:
                bad.append((r.key, f"duplicate round {r.index} in session {session}"))
                continue
            if prev is not None and not observed and r.session_arrival_s != items[0].session_arrival_s:
                bad.append((r.key, f"arrival differs from the session's first round in session {session}"))
                continue
            if prev is None:
                think = 0.0
            elif observed:
                think = max(0.0, r.sent_s - prev.finished_s)
            else:
                think = prev.wait_after_s
            rid = f"{program}#{r.index}"
            out.append(
                TraceRequest(
                    arrival_s=items[0].session_arrival_s,
                    prompt_tokens=r.prompt,
                    output_tokens=r.output,
                    program_id=program,
                    stage=r.index,
                    parents=(f"{program}#{prev.index}",) if prev is not None else (),
                    think_s=think,
                    prefix_tokens=r.prefix,
                    rid=rid,
                )
            )
            prev = r
    return out


def load_tracelab_rounds(path: Path, max_rows: int | None = None) -> TraceLoad:
    """TraceLab per-round JSONL (Claude Code / Codex): one program per ``session_id``.

    prompt = ``input_tokens_total``, prefix = ``prefix_tokens`` (the cache hit), output =
    ``output_tokens``. Rounds of a session run in sequence; ``think_s`` is the observed tool or
    user time between the previous round's last event and this round's last input event. The
    sessions were recorded months apart, so every session is placed at arrival 0 (they replay
    concurrently); spread them with ``poisson_arrivals``. rid is ``<session_id>#<round_index>``.
    """
    _check_max_rows(max_rows)
    bad: list[tuple[int | str, str]] = []
    rounds: list[_Round] = []
    for lineno, line in _jsonl_rows(path, max_rows):
        try:
            obj = _json_object(line)
            session = obj.get("session_id")
            if not isinstance(session, str) or not session:
                raise _BadRow("missing session_id")
            prompt = _prompt(obj.get("input_tokens_total"), "input_tokens_total")
            prefix = _count(obj.get("prefix_tokens"), "prefix_tokens")
            if prefix > prompt:
                raise _BadRow(f"prefix_tokens {prefix} > input_tokens_total {prompt}")
            sent, finished = _round_times(obj.get("timing_events"))
            rounds.append(
                _Round(
                    key=lineno,
                    session=session,
                    index=_count(obj.get("round_index"), "round_index"),
                    prompt=prompt,
                    output=_count(obj.get("output_tokens"), "output_tokens"),
                    prefix=prefix,
                    sent_s=sent,
                    finished_s=finished,
                )
            )
        except _BadRow as e:
            bad.append((lineno, str(e)))
    requests = _chain_sessions(rounds, "", observed=True, bad=bad)
    return TraceLoad(_sorted(requests), bad)


_SESSION_COLUMNS = (
    "session_id",
    "arrival_time",
    "round_idx",
    "prefix_len",
    "input_len",
    "output_len",
    "tool_wait_after_ms",
)


def load_tracelab_sessions(path: Path, max_rows: int | None = None) -> TraceLoad:
    """TraceLab replayer CSV (``multi_session_large.csv``): one program per ``session_id``.

    ``arrival_time`` (ms) is the session's arrival, re-based to the first session. A round's prompt
    is ``prefix_len + input_len`` (the kept context plus the new input), with ``prefix_tokens =
    prefix_len``; ``output_len`` is the decode length. Round k waits ``tool_wait_after_ms`` of
    round k-1 after it finishes. rid is ``s<session_id>#<round_idx>``.
    """
    _check_max_rows(max_rows)
    bad: list[tuple[int | str, str]] = []
    rounds: list[_Round] = []
    for lineno, row in _csv_rows(path, _SESSION_COLUMNS, max_rows, bad):
        try:
            _check_csv_shape(row)
            session = (row["session_id"] or "").strip()
            if not session:
                raise _BadRow("missing session_id")
            prefix = _count(row["prefix_len"], "prefix_len")
            rounds.append(
                _Round(
                    key=lineno,
                    session=session,
                    index=_count(row["round_idx"], "round_idx"),
                    prompt=_prompt(prefix + _count(row["input_len"], "input_len"), "prefix_len + input_len"),
                    output=_count(row["output_len"], "output_len"),
                    prefix=prefix,
                    wait_after_s=_number(row["tool_wait_after_ms"], "tool_wait_after_ms") / 1000.0,
                    session_arrival_s=_number(row["arrival_time"], "arrival_time") / 1000.0,
                )
            )
        except _BadRow as e:
            bad.append((lineno, str(e)))
    requests = _chain_sessions(rounds, "s", observed=False, bad=bad)
    t0 = min((r.arrival_s for r in requests), default=0.0)
    return TraceLoad(_sorted([replace(r, arrival_s=r.arrival_s - t0) for r in requests]), bad)


# --------------------------------------------------------------------------------------------
# Registry

Loader = Callable[..., TraceLoad]

TRACES: dict[str, tuple[str, Loader]] = {
    "azure-code": ("azure-llm-2023/AzureLLMInferenceTrace_code.csv", load_azure),
    "azure-conv": ("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", load_azure),
    "mooncake-conversation": ("mooncake/conversation_trace.jsonl", load_mooncake),
    "mooncake-synthetic": ("mooncake/synthetic_trace.jsonl", load_mooncake),
    "deepresearch": ("jitserve-deepresearch/deepresearch_training.json", load_deepresearch),
    "tracelab-rounds": ("tracelab-agent-example/round_trace.sanitized.jsonl", load_tracelab_rounds),
    "tracelab-sessions": ("tracelab-agent-example/multi_session_large.csv", load_tracelab_sessions),
}


def available_traces(data_dir: str | os.PathLike[str] | None = None) -> dict[str, Path]:
    """Short name -> file, for every registered trace present in the data directory."""
    root = resolve_data_dir(data_dir)
    return {name: root / rel for name, (rel, _) in TRACES.items() if (root / rel).is_file()}


def load(name: str, data_dir: str | os.PathLike[str] | None = None, max_rows: int | None = None) -> TraceLoad:
    """Load a bundled trace by short name (see ``TRACES``); a missing file raises FileNotFoundError."""
    if name not in TRACES:
        raise KeyError(f"unknown trace {name!r}; known: {', '.join(TRACES)}")
    rel, loader = TRACES[name]
    path = resolve_data_dir(data_dir) / rel
    if not path.is_file():
        raise FileNotFoundError(f"trace {name!r} not found at {path} (set ${DATA_ENV} or pass data_dir)")
    return loader(path, max_rows=max_rows)


# --------------------------------------------------------------------------------------------
# Workload shaping. A "unit" is a program (all requests sharing a program_id) or a lone request;
# every helper moves or keeps units whole, so no program ever loses a stage.


def _units(requests: Iterable[TraceRequest]) -> list[list[TraceRequest]]:
    """Units in order of their first arrival (ties keep first-appearance order)."""
    groups: dict[tuple[str, object], list[TraceRequest]] = {}
    for i, r in enumerate(requests):
        key = ("program", r.program_id) if r.program_id is not None else ("request", i)
        groups.setdefault(key, []).append(r)
    return sorted(groups.values(), key=_unit_start)


def _unit_start(unit: list[TraceRequest]) -> float:
    return min(r.arrival_s for r in unit)


def _flatten(units: Iterable[list[TraceRequest]]) -> list[TraceRequest]:
    return _sorted([r for unit in units for r in unit])


def programs(requests: Iterable[TraceRequest]) -> dict[str, list[TraceRequest]]:
    """program_id -> its requests, in input order (lone requests are left out)."""
    out: dict[str, list[TraceRequest]] = {}
    for r in requests:
        if r.program_id is not None:
            out.setdefault(r.program_id, []).append(r)
    return out


def window(requests: Iterable[TraceRequest], start_s: float, end_s: float) -> list[TraceRequest]:
    """Units whose first arrival is in [start_s, end_s), shifted so that start_s becomes 0.

    A program whose first stage is in the window is kept whole, even if a later stage's arrival
    falls after end_s; one that started before start_s is left out entirely.
    """
    if not end_s >= start_s:
        raise ValueError(f"window end {end_s} is before its start {start_s}")
    kept = [u for u in _units(requests) if start_s <= _unit_start(u) < end_s]
    return _flatten([[replace(r, arrival_s=r.arrival_s - start_s) for r in u] for u in kept])


def scale_rate(requests: Iterable[TraceRequest], factor: float) -> list[TraceRequest]:
    """Multiply the arrival rate by ``factor`` (2 = twice as fast): every arrival is divided by it.

    Think times are tool/user latencies, not load, so they are left as they are.
    """
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"rate factor must be finite and > 0, got {factor}")
    return _sorted([replace(r, arrival_s=r.arrival_s / factor) for r in requests])


def poisson_arrivals(requests: Iterable[TraceRequest], rate: float, seed: int = 0) -> list[TraceRequest]:
    """Replace unit arrivals with a seeded Poisson process of ``rate`` units per second.

    The k-th unit in trace order gets the k-th arrival (the first at 0, then exponential gaps),
    so the sequence of lengths is unchanged; a program's stages keep their offsets from its start.
    """
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"rate must be finite and > 0, got {rate}")
    rng = random.Random(seed)
    t = 0.0
    moved: list[list[TraceRequest]] = []
    for k, unit in enumerate(_units(requests)):
        if k:
            t += rng.expovariate(rate)
        shift = t - _unit_start(unit)
        moved.append([replace(r, arrival_s=r.arrival_s + shift) for r in unit])
    return _flatten(moved)


def limit(requests: Iterable[TraceRequest], n: int) -> list[TraceRequest]:
    """The first ``n`` units by arrival: n requests of a flat trace, n whole programs of a DAG trace."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _flatten(_units(requests)[:n])
