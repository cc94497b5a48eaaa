"""Shared, vectorised estimates the SLO policies rank by: remaining work, deadlines, gain.

Policies see thousands of queued requests per step, so per-request Python work is done once
(`ReqArrays.from_views`) and everything else is numpy arithmetic. Times come from a
`PerfModel`; `LinearStepModel` is a small default so policies work without a fitted profile.

Note for the lead: `service_gain`/`degradation` here mirror Tempo Eqs. 1–3 and
`latency_on_time_tokens` mirrors JITServe's latency goodput; they are private stand-ins until
they are unified with scheduler/core/gain.py and goodput.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.slo import SloClass
from scheduler.core.types import EngineView, PerfModel, RequestView

DEFAULT_OUTPUT_LEN = 256  # assumed output length when neither a prediction nor a cap exists
W_IN, W_OUT = 1.0, 2.0  # Tempo's input:output token weights (1:2, as in API pricing)

LATENCY, DEADLINE, COMPOUND, BEST_EFFORT = 0, 1, 2, 3
_CLASS_CODE = {
    SloClass.LATENCY: LATENCY,
    SloClass.DEADLINE: DEADLINE,
    SloClass.COMPOUND: COMPOUND,
    SloClass.BEST_EFFORT: BEST_EFFORT,
}


class LinearStepModel:
    """Affine iteration-time model: a fixed launch cost plus per-token/per-request terms.

    Defaults are rough numbers for a small model on one GPU; replace with a fitted model."""

    def __init__(
        self,
        base_s: float = 0.008,
        prefill_s_per_token: float = 6e-5,
        decode_s_per_req: float = 1.5e-4,
        kv_s_per_token: float = 2e-8,
        spec_s_per_token: float = 6e-5,
    ) -> None:
        self.base_s = base_s
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s_per_req = decode_s_per_req
        self.kv_s_per_token = kv_s_per_token
        self.spec_s_per_token = spec_s_per_token

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return (
            self.base_s
            + self.prefill_s_per_token * prefill_tokens
            + self.decode_s_per_req * decode_reqs
            + self.kv_s_per_token * kv_tokens
            + self.spec_s_per_token * spec_tokens
        )


@dataclass(frozen=True)
class Speeds:
    """Per-step time constants, read from the perf model once per plan (O(1) model calls).

    prefill_time(p) = ceil(p / chunk) * prefill_fixed + p * prefill_per_token, which is exact
    for affine models; decode_s is one iteration at the current batch size."""

    decode_s: float
    prefill_fixed: float
    prefill_per_token: float
    chunk: int

    @classmethod
    def from_view(cls, perf: PerfModel, view: EngineView) -> Speeds:
        chunk = max(1, int(view.chunk_size))
        batch = max(1, min(view.max_running_requests, len(view.running) + len(view.waiting)))
        used_kv = max(0, view.total_kv_tokens - view.free_kv_tokens)
        decode_s = max(perf.step_time(0, batch, used_kv), 1e-9)
        t1 = perf.step_time(1, 0, 0)
        tc = perf.step_time(chunk, 0, 0)
        per_tok = max((tc - t1) / (chunk - 1), 0.0) if chunk > 1 else 0.0
        fixed = max(t1 - per_tok, 0.0)
        if fixed == 0.0 and per_tok == 0.0:
            fixed = decode_s
        return cls(decode_s=decode_s, prefill_fixed=fixed, prefill_per_token=per_tok, chunk=chunk)

    def prefill_time(self, tokens: np.ndarray) -> np.ndarray:
        tokens = np.maximum(tokens, 0.0)
        return np.ceil(tokens / self.chunk) * self.prefill_fixed + tokens * self.prefill_per_token


@dataclass
class ReqArrays:
    """Column view of requests (waiting first, then running) for vectorised scoring."""

    rids: list[str]
    n_waiting: int
    arrival: np.ndarray
    base: np.ndarray  # program arrival for compound stages, else arrival
    prompt: np.ndarray
    generated: np.ndarray
    cached: np.ndarray
    started: np.ndarray  # bool
    running: np.ndarray  # bool
    weight: np.ndarray
    cls: np.ndarray  # int class codes above
    deadline: np.ndarray  # absolute end-to-end (or stage) deadline, nan if none
    ttft_s: np.ndarray  # nan if none
    tpot_s: np.ndarray  # 0 if none
    total_out: np.ndarray  # predicted total output length (upper bound), >= generated + 1
    attained: np.ndarray
    group: np.ndarray  # compound (program, stage) group index, -1 otherwise
    be_tier: np.ndarray  # bool

    @property
    def n(self) -> int:
        return len(self.rids)

    @classmethod
    def from_views(
        cls, waiting: Sequence[RequestView], running: Sequence[RequestView], default_output_len: float
    ) -> ReqArrays:
        """One pass per column: list comprehensions over attributes are the cheapest way to get
        thousands of dataclass fields into numpy (no per-request function calls)."""
        reqs = [*waiting, *running]
        n = len(reqs)
        slos = [r.slo for r in reqs]
        nan = math.nan
        arrival = _floats([r.arrival for r in reqs], n)
        program_arrival = _floats([nan if r.program_arrival is None else r.program_arrival for r in reqs], n)
        base = np.where(np.isnan(program_arrival), arrival, program_arrival)
        generated = _floats([r.generated for r in reqs], n)
        deadline_ms = _floats([nan if s.deadline_ms is None else s.deadline_ms for s in slos], n)
        stage = _floats([nan if r.stage_deadline is None else r.stage_deadline for r in reqs], n)
        deadline = np.where(np.isnan(stage), base + deadline_ms / 1000.0, stage)
        deadline = np.where(np.isnan(deadline_ms), nan, deadline)
        codes = _CLASS_BY_ID
        cls_arr = np.fromiter((codes[id(s.slo_class)] for s in slos), dtype=np.int64, count=n)
        gidx = np.full(n, -1, dtype=np.int64)
        comp = np.flatnonzero(cls_arr == COMPOUND)
        if comp.size:
            groups: dict[tuple[object, object], int] = {}
            for i in comp:
                s = slos[i]
                if s.program_id is not None:
                    gidx[i] = groups.setdefault((s.program_id, s.stage), len(groups))
        running_mask = np.zeros(n, dtype=bool)
        running_mask[len(waiting) :] = True
        return cls(
            rids=[r.rid for r in reqs],
            n_waiting=len(waiting),
            arrival=arrival,
            base=base,
            prompt=_floats([r.prompt_len for r in reqs], n),
            generated=generated,
            cached=_floats([r.prefix_cached for r in reqs], n),
            started=np.fromiter((r.first_token_time is not None for r in reqs), dtype=bool, count=n),
            running=running_mask,
            weight=_floats([s.weight for s in slos], n),
            cls=cls_arr,
            deadline=deadline,
            ttft_s=_floats([nan if s.ttft_ms is None else s.ttft_ms for s in slos], n) / 1000.0,
            tpot_s=_floats([0.0 if s.tpot_ms is None else s.tpot_ms for s in slos], n) / 1000.0,
            total_out=predicted_totals(reqs, generated, default_output_len),
            attained=_floats([r.attained_service for r in reqs], n),
            group=gidx,
            be_tier=np.fromiter((r.best_effort_tier for r in reqs), dtype=bool, count=n),
        )


_CLASS_BY_ID = {id(c): code for c, code in _CLASS_CODE.items()}


def _floats(values: list, n: int) -> np.ndarray:
    return np.fromiter(values, dtype=np.float64, count=n)


def predicted_totals(reqs: Sequence[RequestView], generated: np.ndarray, default_output_len: float) -> np.ndarray:
    """Vector form of predicted_total_output."""
    n = len(reqs)
    nan = math.nan
    predicted = _floats([nan if r.predicted_output_len is None else r.predicted_output_len for r in reqs], n)
    cap = _floats([nan if r.max_new_tokens is None else r.max_new_tokens for r in reqs], n)
    total = np.where(np.isnan(cap), default_output_len, cap)
    total = np.where(np.isnan(predicted), total, np.fmin(predicted, cap))
    return np.maximum(total, generated + 1.0)


def predicted_total_output(r: RequestView, default_output_len: float) -> float:
    """Upper-bound output length: the analyzer's bound, else the client's cap, else a default;
    never the true length (a policy cannot know it). At least one token is still to come.
    (ReqArrays.from_views computes the same thing for many requests at once.)"""
    if r.predicted_output_len is not None:
        total = float(r.predicted_output_len)
        if r.max_new_tokens is not None:
            total = min(total, float(r.max_new_tokens))
    elif r.max_new_tokens is not None:
        total = float(r.max_new_tokens)
    else:
        total = float(default_output_len)
    return max(total, r.generated + 1.0)


def remaining_prefill(a: ReqArrays) -> np.ndarray:
    """Prompt tokens still to compute: the uncached prompt while waiting to start, the whole
    context again after a retraction (resume recomputes it), none once running."""
    fresh = np.maximum(a.prompt - a.cached, 0.0)
    resumed = np.maximum(a.prompt + a.generated - a.cached, 0.0)
    waiting_part = np.where(a.started, resumed, fresh)
    running_part = np.where(a.started, 0.0, fresh)  # running but no token yet: prefill in flight
    return np.where(a.running, running_part, waiting_part)


def remaining_work(a: ReqArrays, sp: Speeds) -> tuple[np.ndarray, np.ndarray]:
    """(remaining prefill seconds, remaining total seconds) at full speed, upper-bound length.
    The iteration that finishes a prefill also emits a token, hence one decode step less."""
    rem_p = remaining_prefill(a)
    rem_out = np.maximum(a.total_out - a.generated, 1.0)
    t_pref = sp.prefill_time(rem_p)
    decode_steps = np.maximum(rem_out - (rem_p > 0), 0.0)
    return t_pref, t_pref + decode_steps * sp.decode_s


def group_reduce(values: np.ndarray, group: np.ndarray, how: str) -> np.ndarray:
    """Replace each grouped entry by its group's max or sum (ungrouped entries: unchanged)."""
    mask = group >= 0
    if not mask.any():
        return values
    ng = int(group.max()) + 1
    out = values.copy()
    if how == "max":
        acc = np.full(ng, -np.inf)
        np.maximum.at(acc, group[mask], values[mask])
    else:
        acc = np.zeros(ng)
        np.add.at(acc, group[mask], values[mask])
    out[mask] = acc[group[mask]]
    return out


def degradation(slo_s: np.ndarray, actual_s: np.ndarray, alpha: float) -> np.ndarray:
    """Tempo's divisive decay f = min(1, (SLO / x)^alpha); 1 when on time or undefined."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(actual_s > 0, slo_s / actual_s, 1.0)
    ratio = np.where(np.isfinite(ratio), ratio, 1.0)
    return np.minimum(1.0, np.maximum(ratio, 0.0) ** alpha)


def service_gain(a: ReqArrays, w_in: float = W_IN, w_out: float = W_OUT) -> np.ndarray:
    """Tempo Eq. 1, weighted by the request's SLO weight, with the predicted output length."""
    return a.weight * (w_in * a.prompt + w_out * a.total_out)


def latency_on_time_tokens(a: ReqArrays, first_emit: np.ndarray, decode_s: float) -> np.ndarray:
    """Remaining output tokens that can still meet their DSLO due time if served from now on at
    one token per iteration: token j is emitted at first_emit + (j - g)·decode_s and due at
    arrival + ttft + j·tpot, so the on-time set is a suffix (or prefix) of the remaining ones."""
    g = a.generated
    total = np.maximum(a.total_out, g + 1.0)
    k = a.arrival + np.nan_to_num(a.ttft_s, nan=np.inf) - first_emit + g * decode_s
    s = decode_s - a.tpot_s
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = k / s
    # s < 0: on time for j >= ceil(bound); s > 0: on time for j <= floor(bound); s == 0: all iff k >= 0.
    lo = np.where(s < 0, np.maximum(g, np.ceil(np.nan_to_num(bound, nan=0.0, posinf=np.inf, neginf=-np.inf))), g)
    hi = np.where(s > 0, np.minimum(total - 1, np.floor(np.nan_to_num(bound, nan=-1.0))), total - 1)
    count = np.clip(hi - lo + 1, 0.0, total - g)
    count = np.where((s == 0) & (k < 0), 0.0, count)
    return np.where(np.isfinite(a.ttft_s), count, total - g)


def preemption_pays(
    gain_rate_in: float, gain_rate_out: float, horizon_s: float, stall_s: float, batch_rate: float, margin: float
) -> bool:
    """Swap a running request out only if the extra gain over the next quantum/frame beats what
    the whole batch loses while the victim's KV is rebuilt, and by a relative margin (JITServe
    App. D.2's 1+δ threshold, which bounds preemption chains)."""
    if gain_rate_in <= gain_rate_out * (1.0 + margin):
        return False
    return (gain_rate_in - gain_rate_out) * horizon_s > stall_s * max(batch_rate, 0.0)


def fairness_blend(priority: np.ndarray, attained: np.ndarray, f: float) -> np.ndarray:
    """(1-f)·priority + f·Fair with both on [0, 1]: priority scaled by its max, Fair = 1 for the
    least-served and 0 for the most-served (VTC-style attained service)."""
    if f <= 0.0 or priority.size == 0:
        return priority
    top = float(np.max(priority))
    norm = priority / top if top > 0 else np.zeros_like(priority)
    most = float(np.max(attained))
    fair = 1.0 - attained / most if most > 0 else np.ones_like(attained)
    return (1.0 - f) * norm + f * fair


def quantum_boundary(step: int, every: int) -> bool:
    return every <= 1 or step % every == 0
