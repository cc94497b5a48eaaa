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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar, overload

import numpy as np

from scheduler.core.packing import floats
from scheduler.core.request_view import RequestView
from scheduler.core.slo import SloClass, SloSpec

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
    predicted = floats([nan if (x := r.predicted_output_len) is None else x for r in reqs], n)
    cap = floats([nan if (x := r.max_new_tokens) is None else x for r in reqs], n)
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

# What a policy maximises: requests that meet their SLO (the server's default), or token-weighted
# service (JITServe §6 reports both token- and request-level goodput; Tempo's service gain, Eq. 1).
OBJECTIVES = ("tokens", "requests")
LATENCY, DEADLINE, COMPOUND, BEST_EFFORT = 0, 1, 2, 3  # class codes in the arrays


def nan_as(values: np.ndarray, fill: float) -> np.ndarray:
    """`values` with NaN replaced by `fill` (infinities kept): np.nan_to_num's one job here, at a
    fraction of its cost on a hot path."""
    return np.where(np.isnan(values), fill, values)


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


def swaps_that_pay(
    gain_rate_in: np.ndarray,
    gain_rate_out: np.ndarray,
    horizon_s: float,
    stall_s: np.ndarray,
    batch_rate: float,
    margin: float,
    also: np.ndarray | None = None,
) -> int:
    """How many of the pairs (strongest blocked request, weakest running one), taken in order,
    are swapped: each swap must beat what the whole batch loses while the victim's KV is rebuilt
    over the next quantum/frame, and by a relative margin (JITServe App. D.2's 1+δ threshold,
    which bounds preemption chains); the first pair that does not pay ends the swaps. `also`:
    a further condition per pair. One array pass: the pairs can be a whole batch."""
    pays = (gain_rate_in > gain_rate_out * (1.0 + margin)) & (
        (gain_rate_in - gain_rate_out) * horizon_s > stall_s * max(batch_rate, 0.0)
    )
    if also is not None:
        pays &= also
    stop = (~pays).nonzero()[0]
    return int(stop[0]) if stop.size else int(pays.size)


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
