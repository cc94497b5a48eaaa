"""The one home of what the SLO machinery estimates about a request: when it is due, how long
its answer may be, and what serving it is worth.

The core policies, the simulator, the router policies and the benchmark metrics all read these
numbers here, so a deadline or a length bound means the same thing everywhere. Most estimates
come in a scalar form (one request: views, the router, metrics) and a vector form (numpy arrays,
nan for "none"): policies see thousands of queued requests per step, so per-request Python work
is done once per pass (scheduler/core/columns.py) and everything else is numpy arithmetic. Tests
hold the two forms equal. Times come from a `PerfModel` (`perf_model.default_model()` when a
policy is given none), so policies work without a fitted profile.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar, overload

import numpy as np

from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, PerfModel, RequestView

if TYPE_CHECKING:
    from scheduler.core.req_arrays import ReqArrays

# Assumed output length when a request carries neither a prediction nor a client cap (a typical
# chat answer; the policies only need an order). The router's policies use the same default.
DEFAULT_OUTPUT_LEN = 256
W_IN, W_OUT = 1.0, 2.0  # Tempo's input:output token weights (1:2, as in API pricing)

Amount = TypeVar("Amount", float, np.ndarray)  # one request's number, or a column of them


# -- deadlines -------------------------------------------------------------------------------


def deadline_seconds(slo: SloSpec) -> float | None:
    """The SLO's end-to-end deadline in seconds, counted from `deadline_base`."""
    return None if slo.deadline_ms is None else slo.deadline_ms / 1000.0


def deadline_base(arrival: float, program_arrival: float | None) -> float:
    """Where an end-to-end deadline is counted from: a compound program's first arrival, else
    the request's own arrival."""
    return arrival if program_arrival is None else program_arrival


@overload
def absolute_deadline(
    deadline_s: float, arrival: float, program_arrival: float | None = None, stage_deadline: float | None = None
) -> float: ...


@overload
def absolute_deadline(
    deadline_s: float | None,
    arrival: float,
    program_arrival: float | None = None,
    stage_deadline: float | None = None,
) -> float | None: ...


def absolute_deadline(
    deadline_s: float | None,
    arrival: float,
    program_arrival: float | None = None,
    stage_deadline: float | None = None,
) -> float | None:
    """Absolute time the whole answer is due, None without a deadline: a compound stage's
    sub-deadline φ(s)·D when known, else `deadline_s` after `deadline_base`."""
    if deadline_s is None:
        return None
    if stage_deadline is not None:
        return stage_deadline
    return deadline_base(arrival, program_arrival) + deadline_s


def deadline_bases(arrival: np.ndarray, program_arrival: np.ndarray) -> np.ndarray:
    """Vector form of `deadline_base` (nan program arrival: none)."""
    return np.where(np.isnan(program_arrival), arrival, program_arrival)


def absolute_deadlines(
    deadline_s: np.ndarray, arrival: np.ndarray, program_arrival: np.ndarray, stage_deadline: np.ndarray
) -> np.ndarray:
    """Vector form of `absolute_deadline` (nan for none, in and out)."""
    base = deadline_bases(arrival, program_arrival)
    due = np.where(np.isnan(stage_deadline), base + deadline_s, stage_deadline)
    return np.where(np.isnan(deadline_s), math.nan, due)


def token_due(slo: SloSpec, arrival: float, index: int) -> float | None:
    """Absolute DSLO due time of output token `index` (0 = first): arrival + TTFT + index·TPOT;
    None without a TTFT."""
    due = slo.token_due_s(index)
    return None if due is None else arrival + due


def token_dues(arrival: np.ndarray, ttft_s: np.ndarray, tpot_s: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Vector form of `token_due`, in seconds (nan TTFT: none; TPOT 0 when the SLO has none)."""
    return arrival + ttft_s + index * tpot_s


def request_deadline(r: RequestView) -> float | None:
    """A view's absolute end-to-end deadline (the program's, or the stage's, for compound)."""
    return absolute_deadline(deadline_seconds(r.slo), r.arrival, r.program_arrival, r.stage_deadline)


def next_token_due(r: RequestView) -> float | None:
    """Absolute time a view's next output token is due under the DSLO, if its SLO has one."""
    return token_due(r.slo, r.arrival, r.generated)


def losing_deadline(r: RequestView) -> float | None:
    """The deadline past which the request has lost its SLO: `next_deadline`, but a compound
    stage's program deadline D rather than its sub-deadline φ(s)·D (a stage behind its share
    of D can still let its program meet D)."""
    if r.slo.slo_class is SloClass.COMPOUND:
        return absolute_deadline(deadline_seconds(r.slo), r.arrival, r.program_arrival)
    return next_deadline(r)


def next_deadline(r: RequestView) -> float | None:
    """The deadline that binds next: the next token's due time for latency requests (the first
    token's while waiting), the end-to-end deadline for deadline/compound requests."""
    cls = r.slo.slo_class
    if cls is SloClass.DEADLINE or cls is SloClass.COMPOUND:
        return request_deadline(r)
    if cls is SloClass.LATENCY:
        return next_token_due(r)
    return None


def answer_due(slo: SloSpec, arrival: float, output_tokens: int) -> float | None:
    """When a router needs the whole answer back (None: best effort).

    Deadline and compound classes: `absolute_deadline` counted from this call's arrival (a router
    knows neither the program's first arrival nor a stage's sub-deadline). Latency class: the
    DSLO due time of token `output_tokens`, arrival + TTFT + L_out·TPOT. That is one TPOT past
    the last token's own due time, in step with the routers' finish estimates, which charge every
    output token (the first included) one decode step. TTFT only: the first token's due time."""
    cls = slo.slo_class
    if cls is SloClass.DEADLINE or cls is SloClass.COMPOUND:
        return absolute_deadline(deadline_seconds(slo), arrival)
    if cls is SloClass.LATENCY:
        return token_due(slo, arrival, output_tokens)
    return None


# -- output length ---------------------------------------------------------------------------


def output_bound(
    predicted: float | None, cap: float | None, generated: float = 0, default: float = DEFAULT_OUTPUT_LEN
) -> float:
    """Upper bound on a request's total output length: the analyzer's bound (at most the
    client's cap), else the cap, else `default`; never the true length (a policy cannot know
    it). At least one token is still to come."""
    if predicted is None:
        total = default if cap is None else cap
    else:
        total = predicted if cap is None else min(predicted, cap)
    return max(float(total), generated + 1.0)


def output_bounds(predicted: np.ndarray, cap: np.ndarray, generated: np.ndarray, default: float) -> np.ndarray:
    """Vector form of `output_bound` (nan prediction or cap: none)."""
    total = np.where(np.isnan(cap), default, cap)
    total = np.where(np.isnan(predicted), total, np.fmin(predicted, cap))
    return np.maximum(total, generated + 1.0)


def predicted_totals(reqs: Sequence[RequestView], generated: np.ndarray, default_output_len: float) -> np.ndarray:
    """`output_bounds` of these views."""
    n = len(reqs)
    nan = math.nan
    predicted = _floats([nan if (x := r.predicted_output_len) is None else x for r in reqs], n)
    cap = _floats([nan if (x := r.max_new_tokens) is None else x for r in reqs], n)
    return output_bounds(predicted, cap, generated, default_output_len)


# -- service gain (Tempo §3.1) ---------------------------------------------------------------


@dataclass(frozen=True)
class GainWeights:
    """Per-token value of input vs output tokens; 1:2 follows common API pricing (Tempo §3.1)."""

    w_in: float = W_IN
    w_out: float = W_OUT


DEFAULT_WEIGHTS = GainWeights()


def check_alpha(alpha: float) -> None:
    if not alpha >= 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")


def base_gain(
    input_tokens: Amount, output_tokens: Amount, weight: float | Amount = 1.0, weights: GainWeights = DEFAULT_WEIGHTS
) -> Amount:
    """Tempo Eq. 1 times the request's weight: the gain of a request served within its SLO.
    Numbers, or numpy arrays for the vector form (elementwise)."""
    return weight * (weights.w_in * input_tokens + weights.w_out * output_tokens)


def degradation(slo_s: float, x_s: float, alpha: float = 1.0) -> float:
    """Tempo's f(SLO, x) = min(1, (SLO/x)^α): 1 when on time (x ≤ SLO), decaying with how late
    x is; 0 once late for the step α = ∞ ("all or nothing") or a target ≤ 0."""
    check_alpha(alpha)
    if x_s <= slo_s:
        return 1.0
    if math.isinf(alpha) or slo_s <= 0:
        return 0.0
    return (slo_s / x_s) ** alpha


def degradations(slo_s: np.ndarray, x_s: np.ndarray, alpha: float = 1.0) -> np.ndarray:
    """Vector form of `degradation`."""
    check_alpha(alpha)
    on_time = x_s <= slo_s
    if math.isinf(alpha):
        return np.where(on_time, 1.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):  # in rows `where` drops
        late = np.where(slo_s > 0, (slo_s / x_s) ** alpha, 0.0)
    return np.where(on_time, 1.0, late)


# -- vector forms over request arrays (scheduler/core/req_arrays.py) -------------------------

LATENCY, DEADLINE, COMPOUND, BEST_EFFORT = 0, 1, 2, 3  # class codes in the arrays


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


def _floats(values: Sequence[float], n: int) -> np.ndarray:
    """These n Python numbers as float64: struct packs them several times faster than numpy
    converts a list, to the same doubles."""
    out = np.empty(n)
    struct.pack_into(f"{n}d", out.data, 0, *values)
    return out


def remaining_prefill(a: ReqArrays) -> np.ndarray:
    """Prompt tokens still to compute: the uncached prompt while waiting to start, the whole
    context again after a retraction (resume recomputes it), none once running."""
    fresh = np.maximum(a.prompt - a.cached, 0.0)
    resumed = np.maximum(a.prompt + a.generated - a.cached, 0.0)
    waiting_part = np.where(a.started, resumed, fresh)
    running_part = np.where(a.started, 0.0, fresh)  # running but no token yet: prefill in flight
    return np.where(a.running, running_part, waiting_part)


def nan_as(values: np.ndarray, fill: float) -> np.ndarray:
    """`values` with NaN replaced by `fill` (infinities kept): np.nan_to_num's one job here, at a
    fraction of its cost on a hot path."""
    return np.where(np.isnan(values), fill, values)


def lost_causes(
    a: ReqArrays, sp: Speeds, now: float, deadline: np.ndarray, t_prefill: np.ndarray | None = None
) -> np.ndarray:
    """Waiting requests (the first a.n_waiting) that will miss their SLO whatever is done now:
    even served alone from now at full speed, a latency request's next token cannot come by its
    due time, or a deadline/compound request's prefill cannot end by its deadline. Both are
    lower bounds on the time needed (no queue, no output beyond the first token), so a request
    marked here is lost under any schedule; the papers stop spending capacity on such work
    (Tempo's and JITServe's deferral, SLOs-Serve's best-effort tier). `t_prefill`: the
    requests' remaining prefill seconds when the caller has them (`remaining_work`'s).
    `deadline`: the deadlines to judge by (`a.end_to_end_deadline`: a compound stage is lost
    only when its program's deadline is out of reach; `a.deadline`: its sub-deadline)."""
    nw = a.n_waiting
    if nw == 0:
        return np.zeros(0, dtype=bool)
    t_pref = t_prefill[:nw] if t_prefill is not None else sp.prefill_time(remaining_prefill(a)[:nw])
    earliest = now + t_pref
    cls = a.cls[:nw]
    ttft = a.ttft_s[:nw]
    lat = (cls == LATENCY) & np.isfinite(ttft)
    due = token_dues(a.arrival[:nw], nan_as(ttft, 0.0), a.tpot_s[:nw], a.generated[:nw])
    deadline = deadline[:nw]
    has_dl = ((cls == DEADLINE) | (cls == COMPOUND)) & np.isfinite(deadline)
    return (lat & (earliest > due)) | (has_dl & (earliest > nan_as(deadline, np.inf)))


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
    ng = int(group.max()) + 1 if group.size else 0
    if ng <= 0:  # no group (ungrouped entries are -1)
        return values
    mask = group >= 0
    members = group[mask]
    if how == "max":
        acc = np.full(ng, -np.inf)
        np.maximum.at(acc, members, values[mask])
    else:  # bincount adds in input order, as np.add.at does: the same sums, several times faster
        acc = np.bincount(members, weights=values[mask], minlength=ng)
    out = values.copy()
    out[mask] = acc[members]
    return out


def latency_on_time_tokens(a: ReqArrays, first_emit: np.ndarray, decode_s: float) -> np.ndarray:
    """Remaining output tokens that can still meet their DSLO due time if served from now on at
    one token per iteration: token j is emitted at first_emit + (j - g)·decode_s and due at
    arrival + ttft + j·tpot, so the on-time set is a suffix (or prefix) of the remaining ones."""
    g = a.generated
    total = np.maximum(a.total_out, g + 1.0)
    k = a.arrival + nan_as(a.ttft_s, np.inf) - first_emit + g * decode_s
    s = decode_s - a.tpot_s
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = k / s
    # s < 0: on time for j >= ceil(bound); s > 0: on time for j <= floor(bound); s == 0: all iff k >= 0.
    # (nan_as and minimum/maximum, not nan_to_num and clip: the same numbers at a third of the
    # cost; an infinite bound stays infinite, which the min/max below treat as the huge finite
    # one nan_to_num would make.)
    lo = np.where(s < 0, np.maximum(g, np.ceil(nan_as(bound, 0.0))), g)
    hi = np.where(s > 0, np.minimum(total - 1, np.floor(nan_as(bound, -1.0))), total - 1)
    count = np.minimum(np.maximum(hi - lo + 1, 0.0), total - g)
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
    top = float(priority.max())
    norm = priority / top if top > 0 else np.zeros_like(priority)
    most = float(attained.max())
    fair = 1.0 - attained / most if most > 0 else np.ones_like(attained)
    return (1.0 - f) * norm + f * fair


def lexsort_fast(keys: tuple[np.ndarray, ...]) -> np.ndarray:
    """Exactly np.lexsort(keys) (last key primary, ties by the earlier keys, then by index),
    but a plain SIMD argsort of the primary key when it has no ties and no NaN, which is the
    usual case for continuous scores and several times faster than lexsort's stable sorts."""
    primary = keys[-1]
    if primary.size > 1:
        order = primary.argsort()
        ranked = primary[order]
        if not np.isnan(ranked[-1]) and not (ranked[1:] == ranked[:-1]).any():  # NaNs sort last
            return order
    return np.lexsort(keys)


def quantum_boundary(step: int, every: int) -> bool:
    return every <= 1 or step % every == 0
