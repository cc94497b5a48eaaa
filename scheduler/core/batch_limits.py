"""The SLO levers every SLO policy gets from the performance model, unless its plan sets them.

- Running-batch cap (SLOs-Serve Alg. 2, PolyServe §3.4/§4.5): the largest decode batch whose
  predicted iteration time still meets the tightest per-token target among running and
  waiting latency requests.
- Prefill chunk (PolyServe §4.7, continuous chunked-prefill prediction, with the DSLO's banked
  slack): the largest chunk whose step keeps every running latency request's next token on
  time. A request ahead of its deadline-based schedule (PolyServe §2.3) lends its slack to
  prefill; one already late constrains nothing (its attainment is lost). A running deadline
  request is held to its pace (time left over tokens left): when every step of a queue's
  prefill is long, decodes that ride them finish late (a long chunk lengthens the steps of
  every running request's remaining tokens, not just the next one). With separate prefill
  steps (SGLang's default) every decode waits out the prefill step, so the prefill step plus the
  decode step after it must fit. A larger chunk only where the raise pays: the first tokens it
  makes of waiting requests that need it outweigh the running requests whose next token its
  step makes late. Never above the start-up size.
- Prefill gate: when no useful chunk fits and no waiting request needs one for its TTFT, the
  step decodes only; the running requests' slack grows, and prefill resumes when it fits.
- A target no batch can meet (not even one request) sets no lever: capping would only starve.
- Prefill alone (`prefill_alone`): under mixed batching a step whose prefill starts a first token
  at risk runs without the decodes when every protected running request's next token stays on time
  after that prefill-only step and the decode step behind it. The step is shorter by the
  decodes' share, so the first token comes sooner, as with SGLang's separate prefill steps,
  and the decodes spend slack they had banked. Mixed steps stay where the slack is short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import COMPOUND, DEADLINE, DEFAULT_OUTPUT_LEN
from scheduler.core.pass_columns import columns_of
from scheduler.core.step_time import prefill_step_times
from scheduler.core.types import EngineView, PerfModel

MIN_CHUNK = 16
# vLLM's default chunked-prefill budget as a step time, in plain decode steps of the running
# batch (`step_ratio_chunk`): JITServe and Tempo both run on it (gmax's `chunk_step_ratio`).
VLLM_CHUNK_STEP_RATIO = 2.75
# A chunk is sized so its predicted step fits the slack with this much to spare: one token late
# loses the request's per-token SLO, and then it protects nothing (the roofline prior can predict
# a long prefill short, and a chunk sized to the whole slack then makes the next token late,
# after which whole-chunk prefills make it later still).
STEP_MARGIN = 0.1
# A running deadline request bounds the chunk by its pace only while that pace is at least this
# many plain decode steps (see _running_slack).
PACE_FLOOR_STEPS = 2.0
# A first token is at risk, and may have a pass without the decodes, while its TTFT has no more
# than this many mixed passes left: further out the mixed passes make it anyway, and a pass the
# decodes wait out is decode throughput lost (prefill_alone).
ALONE_URGENT_PASSES = 3.0


@dataclass(frozen=True)
class BatchLevers:
    batch_cap: int | None
    chunk_size: int | None
    tightest_tpot_s: float | None
    prefill: bool = True  # False: decode only this step (no prefill fits the running requests' slack)


def tightest_tpot(view: EngineView, columns: ViewColumns | None = None) -> float | None:
    """The tightest TPOT (seconds) among running and waiting requests outside the best-effort tier."""
    c = columns if columns is not None else columns_of(view)
    tightest = float(np.fmin.reduce(c.tpot_ms[~c.be_tier], initial=math.nan))  # fmin: nan (none) loses
    return None if math.isnan(tightest) else tightest / 1000.0  # the min of the ms, then to s: the same number


def _running_slack(
    view: EngineView, tokens_per_step: float, c: ViewColumns, decode_s: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """(seconds each on-time running request's next step may take, its weight); None: no
    running request to protect. A latency request's next due token is that far away (under
    speculation a step gives `tokens_per_step` tokens, so the last of them is the one that must
    be on time). A deadline request's is its pace: the time to its deadline over the tokens it
    may still have to make (the upper-bound length), times the tokens a step gives. Kept on the
    pass's columns: a pass asks for it more than once (the chunk, then prefill alone)."""
    memo = c.__dict__.setdefault("_running_slack_memo", {})
    key = (view.now, tokens_per_step, decode_s)
    if key not in memo:
        memo[key] = _running_slack_now(view, tokens_per_step, c, decode_s)
    return memo[key]


def _running_slack_now(
    view: EngineView, tokens_per_step: float, c: ViewColumns, decode_s: float
) -> tuple[np.ndarray, np.ndarray] | None:
    run = slice(c.n_waiting, None)
    ahead = int(math.ceil(tokens_per_step)) - 1
    generated, cls, protected = c.generated[run], c.cls[run], ~c.be_tier[run]
    due = c.token_due(generated + ahead, run)  # nan without a TTFT
    # A request already late (due < now) constrains nothing: its attainment is lost.
    on_time = (generated > 0) & protected & ~np.isnan(c.tpot_ms[run]) & (due >= view.now)
    left = np.maximum(c.total_out(DEFAULT_OUTPUT_LEN)[run] - generated, 1.0)
    pace = (c.deadline[run] - view.now) / left * tokens_per_step  # nan without a deadline
    # A pace under PACE_FLOOR_STEPS plain decode steps leaves prefill almost no room: holding
    # every chunk to it would stall the queue for a request that plain decodes barely keep on
    # time.
    paced = ((cls == DEADLINE) | (cls == COMPOUND)) & protected & (pace >= PACE_FLOOR_STEPS * decode_s)
    keep = on_time | paced
    if not keep.any():
        return None
    budget = np.where(on_time, np.fmin(due - view.now, np.where(paced, pace, np.nan)), pace)
    return budget[keep], c.weight[run][keep].astype(np.float64)


@dataclass(frozen=True)
class _TtftNeeds:
    """Per savable waiting request: the tokens per step it needs to make its first token in
    time, and its weight; `urgent`: deferring prefill by one decode step makes one miss."""

    tokens: np.ndarray
    weight: np.ndarray
    urgent: bool


_NO_NEEDS = _TtftNeeds(np.zeros(0, dtype=np.int64), np.zeros(0), False)


def _ttft_needs(view: EngineView, perf: PerfModel, decodes: int, kv: int, limit: int, c: ViewColumns) -> _TtftNeeds:
    """What each waiting request needs of the chunk to make its TTFT, each counted alone. A
    request that would miss even prefilled alone at full speed needs nothing: no chunk size can
    save it, and sizing the chunk for it only makes running requests late."""
    decode_s = perf.step_time(0, len(view.running), kv)
    nw = c.n_waiting
    slack = c.arrival[:nw] + c.ttft_s[:nw] - view.now  # nan without a TTFT
    pending = (~c.be_tier[:nw] & ~c.started[:nw] & (slack > 0)).nonzero()[0]
    if pending.size == 0:
        return _NO_NEEDS
    remaining = np.maximum(c.prompt[pending] - c.cached[pending], 1).astype(np.int64)
    s = slack[pending]
    # Every step time in one array operation, the rest on the columns (a deep queue of latency
    # requests made this a Python step per request, the largest part of a plan-path pass).
    step = prefill_step_times(perf, np.minimum(remaining, limit), decodes, kv)
    fastest = step * -(-remaining // limit)
    savable = s > fastest
    if not savable.any():
        return _NO_NEEDS
    remaining, s, step, fastest = remaining[savable], s[savable], step[savable], fastest[savable]
    urgent = bool((s - decode_s < fastest).any())
    steps_left = np.maximum(np.floor(s / step).astype(np.int64), 1)
    tokens = np.minimum(-(-remaining // steps_left), limit)
    return _TtftNeeds(tokens, c.weight[:nw][pending[savable]].astype(np.float64), urgent)


def _weighed_chunk(
    perf: PerfModel, fit: int, needs: _TtftNeeds, room: np.ndarray, running_weight: np.ndarray, riding: int, kv: int
) -> int:
    """The chunk that wins the most: a chunk above `fit` makes the first tokens of the waiting
    requests whose need it covers, and costs the running requests whose next token its step
    makes late (each loses its per-token SLO). `fit` (no running request late) unless some
    larger need saves more weight than it costs."""
    above = needs.tokens > fit
    if not above.any():
        return fit
    sizes, at = np.unique(needs.tokens[above], return_inverse=True)
    gain = np.cumsum(np.bincount(at, weights=needs.weight[above], minlength=sizes.size))
    steps = prefill_step_times(perf, sizes, riding, kv)
    order = np.argsort(room)
    late_weight = np.concatenate([[0.0], np.cumsum(running_weight[order])])
    cost = late_weight[np.searchsorted(room[order], steps, side="right")]
    net = gain - cost
    best = int(np.argmax(net))
    return int(sizes[best]) if net[best] > 0 else fit


def batch_levers(
    view: EngineView,
    perf: PerfModel,
    tokens_per_step: float = 1.0,
    mixed_batching: bool = True,
    columns: ViewColumns | None = None,
) -> BatchLevers:
    """`tokens_per_step`: output tokens a decode gains per batch (Acc(s) under speculation, with
    `perf` then costing the drafts and verify tokens): the batch may last that many TPOTs.
    `mixed_batching` False: prefill runs in steps of its own, which every decode waits out."""
    c = columns if columns is not None else columns_of(view)
    nw = c.n_waiting
    tightest = tightest_tpot(view, c)
    decodes = len(view.running)
    kv = c.running_kv
    cap = None
    if tightest is not None:
        tpot = tightest * tokens_per_step
        n_waiting = max(len(view.waiting), 1)
        per_req_kv = kv / decodes if decodes else float(int(c.prompt[:nw].sum()) / n_waiting)
        if perf.step_time(0, 1, int(per_req_kv)) > tpot:
            # Not even one request can meet the tightest target: throttling everyone else would
            # not save it, so leave batch and chunk to SGLang.
            return BatchLevers(None, None, tightest)
        cap = max(perf.max_batch_within(tpot, per_req_kv, limit=view.max_running_requests), 1)
    banked = _slack_room(view, perf, tokens_per_step, mixed_batching, c, kv)
    if view.chunk_size <= 0 or banked is None:
        return BatchLevers(cap, None, tightest)
    riding = decodes if mixed_batching else 0  # decodes inside the prefill step itself
    room, running_weight = banked
    fit = _fit(perf, room, riding, kv, view.chunk_size)
    needs = _ttft_needs(view, perf, riding, kv, view.chunk_size, c)
    if fit < MIN_CHUNK and not needs.urgent:
        # too little room for a useful chunk, and no TTFT needs one now: decode, bank slack
        return BatchLevers(cap, MIN_CHUNK, tightest, prefill=False)
    chunk = _weighed_chunk(perf, max(fit, MIN_CHUNK), needs, room, running_weight, riding, kv)
    return BatchLevers(cap, min(view.chunk_size, chunk), tightest)


def _slack_room(
    view: EngineView, perf: PerfModel, tokens_per_step: float, mixed_batching: bool, c: ViewColumns, kv: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """(the time each protected running request leaves the next prefill step, with the step
    margin taken off; its weight), or None when no running request is protected."""
    decode_s = perf.step_time(0, len(view.running), kv)
    slack = _running_slack(view, tokens_per_step, c, decode_s)
    if slack is None:
        return None
    budgets, weight = slack
    return (budgets if mixed_batching else budgets - decode_s) / (1 + STEP_MARGIN), weight


def _fit(perf: PerfModel, room: np.ndarray, riding: int, kv: int, limit: int) -> int:
    """The largest chunk whose step keeps every protected running request's next token."""
    tightest_room = float(room.min())
    return perf.max_chunk_within(tightest_room, riding, kv, limit) if tightest_room > 0 else 0


def banked_slack_chunk(view: EngineView, perf: PerfModel, c: ViewColumns, max_step_s: float = math.inf) -> int | None:
    """The largest prefill chunk of a mixed step that the running requests' banked slack allows:
    every on-time one's next token (a deadline one's pace) still on time, and the step no
    longer than `max_step_s` (a caller's own per-step targets). None: nothing to protect."""
    if view.chunk_size <= 0:
        return None
    kv = c.running_kv
    banked = _slack_room(view, perf, 1.0, True, c, kv)
    if banked is None:
        return None
    room = np.minimum(banked[0], max_step_s / (1 + STEP_MARGIN))
    return _fit(perf, room, len(view.running), kv, view.chunk_size)


def step_ratio_chunk(view: EngineView, perf: PerfModel, ratio: float, columns: ViewColumns | None = None) -> int:
    """The largest chunk whose mixed step takes at most `ratio` plain decode steps of the
    running batch (of one decode when none runs), and at least MIN_CHUNK: a per-step prefill
    budget stated in time, so a card that prefills faster than it decodes gets more tokens."""
    c = columns if columns is not None else columns_of(view)
    decodes, kv = len(view.running), c.running_kv
    budget = ratio * perf.step_time(0, max(decodes, 1), kv)
    return max(perf.max_chunk_within(budget, decodes, kv, max(view.chunk_size, MIN_CHUNK)), MIN_CHUNK)


def prefill_alone(view: EngineView, perf: PerfModel, chunk: int, c: ViewColumns) -> bool:
    """Whether this step's prefill should run without the decodes (see the module's docstring):
    a first token at risk waits on it (a running prefill or a waiting latency request outside
    the best-effort tier, whose TTFT has time left but no more than ALONE_URGENT_PASSES mixed
    steps of it), and a prefill-only step of the tokens it would take (at most `chunk`), then
    one decode step, keeps every protected running request's next token on time with the step
    margin to spare."""
    nw = c.n_waiting
    run = slice(nw, None)
    started = c.started[run]
    if chunk <= 0 or not started.any():
        return False  # nothing decodes, or nothing prefills: there is nothing to choose
    first = ~c.started & ~c.be_tier  # waiting, or running without a first token yet
    left = np.maximum(c.prompt - c.cached, 0)
    tokens = min(chunk, int(left[first].sum()))
    if tokens <= 0:
        return False
    kv = c.running_kv
    mixed_s = perf.step_time(tokens, int(started.sum()), kv)
    ttft_left = c.arrival + c.ttft_s - view.now  # nan without a TTFT
    at_risk = first & (ttft_left > 0) & (ttft_left <= ALONE_URGENT_PASSES * mixed_s)
    if not at_risk.any():
        return False  # no first token needs the shorter step: a mixed one gives the decodes their token too
    room = _slack_room(view, perf, 1.0, False, c, kv)  # the prefill step, then the decode step
    if room is None:
        return True  # no running request has a next token due
    tightest = float(room[0].min())
    return tightest > 0 and perf.step_time(tokens, 0, kv) <= tightest
