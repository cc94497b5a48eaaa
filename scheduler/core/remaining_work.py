"""What is left to serve of a pass's requests, in seconds at full speed: the remaining prefill
and decode work, the requests no schedule can save any more, and how many of a latency
request's tokens can still be on time. Vector forms over `ReqArrays` (Tempo, GMAX and the plan
path's lost-cause hold read them); the scalar estimates they build on live in estimates.py."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import COMPOUND, DEADLINE, LATENCY, nan_as, token_dues
from scheduler.core.lost_hold import tier_lost
from scheduler.core.pass_columns import columns_of
from scheduler.core.req_arrays import ReqArrays
from scheduler.core.types import EngineView, PerfModel


@dataclass(frozen=True)
class Speeds:
    """Per-step time constants, read from the perf model once per plan (O(1) model calls).

    prefill_time(p) = ceil(p / chunk) * prefill_fixed + p * prefill_per_token, which is exact
    for affine models; decode_s is one iteration of the batch the SLO work will share: the
    running and waiting requests up to the engine's cap, less the best-effort tier's lost ones,
    which the plan path keeps out of it (lost_hold). Counted in, a tier that grew under overload
    priced every newcomer's decode as if it ran beside the whole tier, every newcomer with a
    tight TPOT looked lost, and it went to the tier too."""

    decode_s: float
    prefill_fixed: float
    prefill_per_token: float
    chunk: int

    @classmethod
    def from_view(cls, perf: PerfModel, view: EngineView, columns: ViewColumns | None = None) -> Speeds:
        chunk = max(1, int(view.chunk_size))
        c = columns if columns is not None else columns_of(view)
        kept_out = int(np.count_nonzero(tier_lost(c, view.now)))
        batch = max(1, min(view.max_running_requests, len(view.running) + len(view.waiting) - kept_out))
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


def remaining_prefill(a: ReqArrays) -> np.ndarray:
    """Prompt tokens still to compute: the uncached prompt while waiting to start, the whole
    context again after a retraction (resume recomputes it), none once running."""
    fresh = np.maximum(a.prompt - a.cached, 0.0)
    resumed = np.maximum(a.prompt + a.generated - a.cached, 0.0)
    waiting_part = np.where(a.started, resumed, fresh)
    running_part = np.where(a.started, 0.0, fresh)  # running but no token yet: prefill in flight
    return np.where(a.running, running_part, waiting_part)


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


def backlogged_first_tokens(
    a: ReqArrays, sp: Speeds, now: float, order: np.ndarray, t_prefill: np.ndarray | None = None
) -> np.ndarray:
    """Waiting latency requests still without a first token (a mask over the first
    a.n_waiting) whose first token, served in `order` (waiting positions) behind the running
    prefills and the waiting prefills before it, at full speed, comes after its TTFT. Each
    alone may still fit its window (`lost_causes` keeps it); in a burst serving them all
    makes the ones behind late too. Found twice: the requests found late the first time no
    longer count ahead of the rest, which may then make theirs."""
    nw = a.n_waiting
    t_pref = t_prefill if t_prefill is not None else sp.prefill_time(remaining_prefill(a))
    ahead = now + float(t_pref[nw:].sum())  # the running prefills first
    pref = t_pref[order]
    due = a.arrival[order] + a.ttft_s[order]  # nan without a TTFT: never late below
    watch = (a.cls[order] == LATENCY) & ~a.started[order]
    out = np.zeros(nw, dtype=bool)
    late = watch & (np.cumsum(pref) + ahead > due)
    if not late.any():
        return out
    kept = np.where(late, 0.0, pref)
    late = watch & (np.cumsum(kept) - kept + pref + ahead > due)
    out[order[late]] = True
    return out


def remaining_work(a: ReqArrays, sp: Speeds) -> tuple[np.ndarray, np.ndarray]:
    """(remaining prefill seconds, remaining total seconds) at full speed, upper-bound length.
    The iteration that finishes a prefill also emits a token, hence one decode step less."""
    rem_p = remaining_prefill(a)
    rem_out = np.maximum(a.total_out - a.generated, 1.0)
    t_pref = sp.prefill_time(rem_p)
    decode_steps = np.maximum(rem_out - (rem_p > 0), 0.0)
    return t_pref, t_pref + decode_steps * sp.decode_s


def latency_on_time_tokens(a: ReqArrays, first_emit: np.ndarray, decode_s: float) -> np.ndarray:
    """Remaining output tokens that can still meet their DSLO due time if served from now on at
    one token per iteration: token j is emitted at first_emit + (j - g)·decode_s and due at
    arrival + ttft + j·tpot, so the on-time set is a suffix (or prefix) of the remaining ones."""
    g = a.generated
    total = np.maximum(a.total_out, g + 1.0)
    left = total - g
    k = a.arrival + nan_as(a.ttft_s, np.inf) - first_emit + g * decode_s
    s = decode_s - a.tpot_s
    with np.errstate(divide="ignore", invalid="ignore"):
        bound = k / s
    # Token j is on time iff j·s <= k. s > 0: j <= floor(bound), s < 0: j >= ceil(bound), both
    # within [g, total); the clamp to [0, left] takes the range's own ends. s == 0: all iff
    # k >= 0. (bound is NaN only where s == 0 or there is no TTFT, both set apart below.)
    count = np.minimum(np.maximum(np.where(s > 0, np.floor(bound) - g + 1.0, total - np.ceil(bound)), 0.0), left)
    count = np.where(s == 0, np.where(k >= 0, left, 0.0), count)
    return np.where(np.isfinite(a.ttft_s), count, left)
