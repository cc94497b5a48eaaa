"""Open-loop load: every request is sent at its planned time whether or not earlier ones are done.

Programs run as DAGs: a stage is sent `think_s` after its last parent finished, and its prompt
starts with its parents' real outputs (or, for agent rounds, the previous call's context up to
`prefix_tokens`), then real text up to the trace's prompt length. Requests stream; every output
token's arrival is recorded.

The true output length never reaches the policy. `LengthControl`:
- `hint`: the client's own cap goes in `max_new_tokens`; the true length travels in
  `custom_params.slo_oracle_output_len`, which sglang-slo's scheduler uses to end the request
  there (as the model's EOS would) and which no policy reads;
- `client`: the client's cap in `max_new_tokens`; the client closes the stream once it has the
  true number of tokens (works against any server, e.g. stock SGLang; the server may compute a
  token or two more before it notices);
- `max-tokens`: the true length in `max_new_tokens` (what sglang.bench_serving does; it reveals
  the length to the server, so use it only for parity with such tools).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

import aiohttp

from benchmarks.goodput.records import PlannedRequest, RequestRecord
from scheduler.core.estimates import deadline_seconds
from scheduler.core.slo import parse_slo
from wire import ORACLE_HINT_PARAM


class LengthControl(str, Enum):
    HINT = "hint"
    CLIENT = "client"
    MAX_TOKENS = "max-tokens"


@dataclass(frozen=True)
class LoadOptions:
    length_control: LengthControl = LengthControl.HINT
    send_slo: bool = True  # False for servers that reject the `slo` field (stock SGLang)
    client_max_tokens: int = 1024  # the cap a real client puts in max_new_tokens
    duration_s: float | None = None  # no request is sent later than this after the start
    drain_timeout_s: float = 60.0  # after the last planned send, how long in-flight requests may take
    # past the drain timeout, wait on for requests whose SLO can still be met (at most
    # max_drain_s after the last planned send): cutting them would score as misses answers that
    # would have been on time, and most of all those a deferring policy put off on purpose
    drain_until_due: bool = True
    max_drain_s: float = 1800.0
    seed: int = 0


PromptFor = Callable[[PlannedRequest, random.Random], list[int]]


class _Program:
    """Shared state of one program: its first send, and each finished call's ids."""

    def __init__(self) -> None:
        self.start_s: float | None = None
        self.done: dict[str, asyncio.Event] = {}
        self.finish_s: dict[str, float] = {}
        self.prompt_ids: dict[str, list[int]] = {}
        self.output_ids: dict[str, list[int]] = {}


def _key(p: PlannedRequest) -> str:
    return p.req.rid


def _body(p: PlannedRequest, prompt_ids: list[int], opts: LoadOptions) -> dict[str, Any]:
    target = p.req.output_tokens
    params: dict[str, Any] = {"temperature": 0, "ignore_eos": True}
    if opts.length_control is LengthControl.MAX_TOKENS:
        params["max_new_tokens"] = target
    else:
        params["max_new_tokens"] = max(opts.client_max_tokens, target)
        if opts.length_control is LengthControl.HINT:
            params["custom_params"] = {ORACLE_HINT_PARAM: target}
    body: dict[str, Any] = {"input_ids": prompt_ids, "sampling_params": params, "stream": True}
    if opts.send_slo and p.slo:
        body["slo"] = p.slo
    return body


LATE_SEND_GRACE_S = 1.0  # a send the client made late still counts from its own send time


def last_chances(planned: list[PlannedRequest]) -> dict[str, float]:
    """Per SLO request, the planned time after which it can no longer be attained, with a
    second's grace for a send that went out late: a deadline request's deadline, a compound
    stage's program deadline (counted from the program's first planned arrival), a latency
    request's last token due under its DSLO (the client knows the true length). Best-effort
    requests have none: only the drain timeout ends them."""
    first_arrival: dict[str, float] = {}
    for p in planned:
        if p.req.program_id is not None:
            at = first_arrival.get(p.req.program_id, math.inf)
            first_arrival[p.req.program_id] = min(at, p.req.arrival_s)
    out: dict[str, float] = {}
    for p in planned:
        if not p.slo or p.cls == "none":
            continue
        spec = parse_slo(p.slo)
        if p.program_deadline_ms is not None and p.req.program_id is not None:
            due = first_arrival[p.req.program_id] + p.program_deadline_ms / 1000.0
        elif (rel := deadline_seconds(spec)) is not None:
            due = p.req.arrival_s + rel
        elif (last := spec.token_due_s(max(p.req.output_tokens - 1, 0))) is not None:
            due = p.req.arrival_s + last
        else:
            continue
        out[_key(p)] = due + LATE_SEND_GRACE_S
    return out


def compose_prompt(
    p: PlannedRequest, fresh: list[int], parents_prompt: list[list[int]], parents_output: list[list[int]]
) -> list[int]:
    """The stage's prompt: inherited context first, then fresh text, exactly prompt_tokens long.

    Agent rounds (prefix_tokens > 0) reuse the last parent's prompt + output as their leading
    tokens (a real conversation prefix, cacheable); DAG stages put their parents' outputs first.
    """
    n = p.req.prompt_tokens
    if p.req.prefix_tokens > 0 and parents_prompt:
        inherited = (parents_prompt[-1] + parents_output[-1])[: p.req.prefix_tokens]
    else:
        inherited = [t for out in parents_output for t in out]
    head = inherited[:n]
    return head + fresh[: n - len(head)]


class LoadGenerator:
    """Runs one planned workload against one server URL and returns a record per request."""

    def __init__(self, url: str, prompt_for: PromptFor, opts: LoadOptions, on_done: Callable[[], None] | None = None):
        self.url = url.rstrip("/")
        self.prompt_for = prompt_for
        self.opts = opts
        self.on_done = on_done or (lambda: None)

    async def run(self, planned: list[PlannedRequest]) -> list[RequestRecord]:
        rng = random.Random(self.opts.seed)
        fresh = {_key(p): self.prompt_for(p, rng) for p in planned}  # drawn up front: same for every server
        programs: dict[str, _Program] = {}
        for p in planned:
            prog = programs.setdefault(p.req.program_id or _key(p), _Program())
            prog.done[_key(p)] = asyncio.Event()
        records = {_key(p): self._record(p) for p in planned}
        # One connection per request: a pooled keep-alive connection left idle past the server's
        # keep-alive timeout (uvicorn: 5 s) is closed by the server, and a request written on it
        # just then fails with "Server disconnected" before the server ever saw it (compound
        # stages sent after a think time are the ones that meet such a connection).
        conn = aiohttp.TCPConnector(limit=0, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=conn, timeout=timeout) as session:
            self.t0 = time.perf_counter()
            tasks = [
                asyncio.create_task(self._one(session, p, records[_key(p)], programs, fresh[_key(p)])) for p in planned
            ]
            last_plan = max((p.req.arrival_s for p in planned), default=0.0)
            if self.opts.duration_s is not None:
                last_plan = min(last_plan, self.opts.duration_s)
            horizon = last_plan + self.opts.drain_timeout_s
            _, pending = await asyncio.wait(tasks, timeout=max(1.0, horizon - self._now()))
            if pending and self.opts.drain_until_due:
                due = last_chances([p for p in planned if p.req.arrival_s <= last_plan])  # not past --duration
                key_of = {task: _key(p) for task, p in zip(tasks, planned, strict=True)}
                until = max((d for t in pending if (d := due.get(key_of[t])) is not None), default=horizon)
                until = min(until, last_plan + self.opts.max_drain_s)
                if until > self._now():
                    _, pending = await asyncio.wait(pending, timeout=until - self._now())
            for task in pending:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                raise r  # a bug in the client, not a lost request
        return [records[_key(p)] for p in planned]

    def _now(self) -> float:
        return time.perf_counter() - self.t0

    @staticmethod
    def _record(p: PlannedRequest) -> RequestRecord:
        return RequestRecord(
            key=_key(p),
            cls=p.cls,
            slo=dict(p.slo),
            prompt_tokens=p.req.prompt_tokens,
            target_output_tokens=p.req.output_tokens,
            scheduled_s=p.req.arrival_s,
            program_id=p.req.program_id,
            program_deadline_s=None if p.program_deadline_ms is None else p.program_deadline_ms / 1000.0,
        )

    async def _one(
        self,
        session: aiohttp.ClientSession,
        p: PlannedRequest,
        rec: RequestRecord,
        programs: dict[str, _Program],
        fresh: list[int],
    ) -> None:
        prog = programs[p.req.program_id or _key(p)]
        try:
            await self._wait_turn(p, rec, prog)
            if rec.error is None:
                prompt = compose_prompt(
                    p,
                    fresh,
                    [prog.prompt_ids[k] for k in p.req.parents],
                    [prog.output_ids[k] for k in p.req.parents],
                )
                rec.prompt_tokens = len(prompt)
                prog.prompt_ids[rec.key] = prompt
                rec.send_s = self._now()
                if prog.start_s is None:
                    prog.start_s = rec.send_s
                rec.program_start_s = prog.start_s if p.req.program_id else None
                prog.output_ids[rec.key] = await self._stream(session, p, rec, prompt)
        except asyncio.CancelledError:
            if rec.sent and rec.finish_s is None:
                rec.cut, rec.error = True, "cut at the end of the drain"
            elif not rec.sent:
                rec.error = rec.error or "never sent: the run ended first"
            raise
        finally:
            if rec.finish_s is not None:
                prog.finish_s[rec.key] = rec.finish_s
            prog.done[rec.key].set()
            self.on_done()

    async def _wait_turn(self, p: PlannedRequest, rec: RequestRecord, prog: _Program) -> None:
        """Sleep until the planned arrival, or until every parent finished plus the think time."""
        if p.req.parents:
            for parent in p.req.parents:
                await prog.done[parent].wait()
            if any(k not in prog.finish_s for k in p.req.parents):
                rec.error = "never sent: a parent stage did not finish"
                return
            rec.scheduled_s = max(prog.finish_s[k] for k in p.req.parents) + p.req.think_s
        await asyncio.sleep(max(0.0, rec.scheduled_s - self._now()))
        if self.opts.duration_s is not None and rec.scheduled_s > self.opts.duration_s:
            rec.error = "never sent: after the run's duration"

    async def _stream(
        self, session: aiohttp.ClientSession, p: PlannedRequest, rec: RequestRecord, prompt: list[int]
    ) -> list[int]:
        target = p.req.output_tokens
        client_stop = self.opts.length_control is LengthControl.CLIENT
        output: list[int] = []
        try:
            async with session.post(self.url + "/generate", json=_body(p, prompt, self.opts)) as resp:
                if resp.status != 200:
                    rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    return output
                async for raw in resp.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    now = self._now()
                    chunk = json.loads(line[6:])
                    meta = chunk.get("meta_info", {})
                    n = int(meta.get("completion_tokens", len(rec.token_s)))
                    ids = chunk.get("output_ids") or []
                    output = ids if len(ids) == n else output + list(ids)  # cumulative or incremental streams
                    rec.token_s.extend([now] * max(0, n - len(rec.token_s)))
                    reason = meta.get("finish_reason")
                    if reason is not None:
                        rec.finish_s = now
                        rec.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
                        slo = meta.get("slo") or {}
                        rec.tier = slo.get("tier")
                        ttft = slo.get("ttft_ms")
                        rec.server_ttft_ms = float(ttft) if isinstance(ttft, (int, float)) else None
                        break
                    if client_stop and len(rec.token_s) >= target:
                        rec.token_s = rec.token_s[:target]
                        rec.finish_s, rec.finish_reason = rec.token_s[-1], "client_stop"
                        break  # leaving the context closes the connection: SGLang aborts the request
        except aiohttp.ClientError as e:
            rec.error = f"{type(e).__name__}: {e}"
        if rec.finish_s is None and rec.error is None:
            rec.error = "stream ended without a final chunk"
        return output[:target] if client_stop else output
