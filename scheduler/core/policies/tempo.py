"""Tempo's Largest Service Density First (LSDF, Tempo §4.2–4.3, Alg. 1, Eq. 4).

Density = expected service gain / remaining time budget. The budget is Eq. 4's
Estimated_TTLT − processed_time under "just enough" serving: a request finishes at its binding
deadline if there is time (so far deadlines get a low density and spare bandwidth for others) or
as soon as its remaining work allows if not (then the gain is cut by f = min(1, (SLO/x)^α)).
Latency requests use their next token's DSLO due time, a waiting one's plus a share of its
decode span (`decode_span_share`), and Eq. 3's gain (prompt gain while the first token is
pending plus the remaining output tokens) under the "tokens" objective, their weight under the
server's default, "requests"; compound stages use the largest
remaining work in their (program, stage), since finishing one call early does not finish the
stage. Best-effort requests get a reserved share of batch slots, served FCFS, which SLO requests
backfill when unused. Preemption happens only at quanta and only when it pays for its stall.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.core.batch_limits import VLLM_CHUNK_STEP_RATIO
from scheduler.core.estimates import (
    BEST_EFFORT,
    DEFAULT_OUTPUT_LEN,
    LATENCY,
    OBJECTIVES,
    W_IN,
    W_OUT,
    GainWeights,
    base_gain,
    degradations,
    fairness_blend,
    group_reduce,
    lexsort_fast,
    nan_as,
    quantum_boundary,
    swaps_that_pay,
    token_dues,
)
from scheduler.core.pass_columns import columns_of
from scheduler.core.perf_model import default_model
from scheduler.core.registry import require
from scheduler.core.remaining_work import Speeds, backlogged_first_tokens, lost_causes, remaining_work
from scheduler.core.req_arrays import ReqArrays
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView, PerfModel, StepPlan


def reserved_slots(step: int, quantum_steps: int, share: float, batch: int) -> int:
    """Best-effort slots in the current quantum: `share` of the batch on average, spread over
    quanta when it is fractional (10 % of a batch of 4 = one slot in 4 of every 10 quanta), so
    even a tiny batch gives best-effort work a bounded wait."""
    if share <= 0.0:
        return 0
    per_quantum = share * batch
    q = step // max(1, quantum_steps)
    return min(batch, int(math.floor((q + 1) * per_quantum + 1e-9) - math.floor(q * per_quantum + 1e-9)))


def reserve_positions(
    n_slo: int, n_be: int, running: int, be_running: int, step: int, quantum_steps: int, share: float, batch: int
) -> np.ndarray:
    """Where in the admission order the waiting best-effort requests with a reserved slot go,
    among `n_slo` SLO requests (ascending positions, at most `n_be`).

    The reserve is a share of the batch that actually runs, and the policy cannot know that
    batch: the plan path's cap (the tightest TPOT's, a policy's own), the engine's memory or a
    prefill budget may stop admission long before `batch` (max_running_requests). So the
    reserve holds for every prefix of the order: a best-effort request goes at position j only
    while the best-effort requests in the batch would stay within `reserved_slots` of the
    batch of `running + j + 1`. Ranked ahead of all SLO work instead, the reserve of the whole
    `batch` filled a capped batch with best-effort requests alone."""
    if n_be == 0 or share <= 0.0:
        return np.zeros(0, dtype=np.int64)
    j = np.arange(n_slo + n_be, dtype=np.int64)
    size = np.minimum(running + j + 1, max(batch, 1)).astype(np.float64)
    per_quantum = share * size
    q = step // max(1, quantum_steps)
    allowed = np.floor((q + 1) * per_quantum + 1e-9) - np.floor(q * per_quantum + 1e-9)
    allowed = np.maximum.accumulate(np.minimum(allowed, size) - be_running)
    k = int(min(n_be, max(0.0, allowed[-1])))
    if k == 0:
        return np.zeros(0, dtype=np.int64)
    pos = np.searchsorted(allowed, np.arange(1, k + 1), side="left").astype(np.int64)
    # Two slots opening at one position: the second request takes the next one; a slot opening
    # past the SLO requests: right after them.
    i = np.arange(k)
    return np.minimum(np.maximum.accumulate(pos - i) + i, n_slo + i)


@dataclass(frozen=True)
class TempoParams:
    alpha: float = 1.0  # gain degradation exponent (Eq. 1-3)
    w_in: float = W_IN
    w_out: float = W_OUT
    reserve_share: float = 0.1  # of the batch that runs, for best-effort work (kept in every prefix of the order)
    fairness: float = 0.0
    quantum_steps: int = 20  # decode steps between preemption points
    preempt: bool = True
    preempt_margin: float = 0.0
    default_output_len: float = DEFAULT_OUTPUT_LEN
    defer_lost: bool = True  # waiting work that can no longer meet its SLO runs after the rest
    # With defer_lost: so does a latency request whose first token the prefills ahead of it in
    # this order make late (remaining_work.backlogged_first_tokens): alone it fits its TTFT,
    # behind the queue it does not, and served anyway it makes the requests behind it late too
    # (the sweep: benchmarks/RESULTS.md).
    defer_backlogged: bool = True
    # Judge a compound stage's gain and whether it is lost by its learned sub-deadline φ(s)·D
    # rather than its program's deadline D. By default the sub-deadline sets only the stage's
    # time budget (its urgency, §4.1), while the gain is the program's, earned if D is met
    # (Eq. 2): with the sub-deadline everywhere, a stage behind φ(s)·D is degraded and
    # deferred while its program could still finish, which costs goodput.
    stage_deadlines: bool = False
    # A request's gain: 1 (its weight) when it meets its SLO, the server's measure; "tokens":
    # Eq. 1's service gain, tokens weighted by w_in and w_out, the paper's measure, which under
    # contention ranks long requests first and so meets fewer of them.
    objective: str = "requests"
    # A waiting latency request's time budget runs to its first token's due time plus this share
    # of its decode span (the upper-bound length times its TPOT). Eq. 4's budget runs to the last
    # token (share 1), which with an upper-bound length puts long answers behind their own first
    # token's due time; the next token alone (share 0) ranks only by the first token's due time,
    # so every request starts late in its TTFT window, banks no slack, and a tight TPOT among
    # them holds every prefill chunk small.
    decode_span_share: float = 0.15
    # A step whose prefill starts a first token at risk runs without the decodes where their
    # slack allows (batch_limits.prefill_alone): a shorter pass for first tokens a few passes
    # from their TTFT (the sweep: benchmarks/RESULTS.md).
    prefill_alone: bool = True
    # The most prompt tokens one step prefills, over what the perf model sizes: as many as keep
    # the mixed step within this many plain decode steps of the running batch (0: off). Tempo
    # runs on vLLM's chunked prefill, as JITServe does, and this is its default budget stated in
    # time (gmax's parameter of the same name). Without it a step prefills whatever chunk the
    # TPOTs of the running requests allow, and under load the first tokens behind such a step
    # wait on it: smaller steps start requests at a steadier pace (benchmarks/RESULTS.md).
    chunk_step_ratio: float = VLLM_CHUNK_STEP_RATIO

    def __post_init__(self) -> None:
        require(self.objective in OBJECTIVES, "objective", f"must be one of {OBJECTIVES}", self.objective)
        require(0.0 <= self.decode_span_share <= 1.0, "decode_span_share", "must be in [0, 1]", self.decode_span_share)
        require(0.0 <= self.reserve_share <= 1.0, "reserve_share", "must be in [0, 1]", self.reserve_share)
        require(0.0 <= self.fairness <= 1.0, "fairness", "must be in [0, 1]", self.fairness)
        require(self.chunk_step_ratio >= 0.0, "chunk_step_ratio", "must be >= 0", self.chunk_step_ratio)


class TempoPolicy:
    name = "tempo"
    slo_levers = True

    def __init__(self, params: TempoParams = TempoParams(), perf_model: PerfModel | None = None) -> None:
        self.perf = perf_model if perf_model is not None else default_model()
        self.alpha = params.alpha
        self.w_in = params.w_in
        self.w_out = params.w_out
        self.reserve_share = params.reserve_share
        self.fairness = params.fairness
        self.quantum_steps = params.quantum_steps
        self.preempt = params.preempt
        self.preempt_margin = params.preempt_margin
        self.default_output_len = params.default_output_len
        self.defer_lost = params.defer_lost
        self.defer_backlogged = params.defer_backlogged
        self.stage_deadlines = params.stage_deadlines
        self.per_request = params.objective == "requests"
        self.decode_span_share = params.decode_span_share
        self.prefill_alone = params.prefill_alone  # read by plan_path.settings_for
        self.chunk_step_ratio = params.chunk_step_ratio or None  # read by plan_path.settings_for
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    # -- scoring -----------------------------------------------------------------------------

    def densities(self, view: EngineView, a: ReqArrays | None = None, sp: Speeds | None = None) -> np.ndarray:
        """Service density per request, waiting first then running (best-effort: 0)."""
        a = a if a is not None else self._arrays(view)
        return self._densities(view, a, sp if sp is not None else Speeds.from_view(self.perf, view))[0]

    def _densities(self, view: EngineView, a: ReqArrays, sp: Speeds) -> tuple[np.ndarray, np.ndarray]:
        """(`densities`, each request's remaining prefill seconds, which the plan reuses)."""
        now = view.now
        t_pref, work = remaining_work(a, sp)
        work = group_reduce(work, a.group, "max")  # a stage ends when its slowest call ends
        floor = sp.decode_s
        weights = GainWeights(self.w_in, self.w_out)

        # Deadline and compound: all-or-decaying gain at the end-to-end deadline; a compound
        # stage's time budget runs to its sub-deadline, its gain to its program's deadline.
        has_dl = np.isfinite(a.deadline)
        dl = np.where(has_dl, a.deadline, now)
        finish = now + work
        gain_dl = self._gain_deadline(a)
        f_dl = degradations(np.where(has_dl, gain_dl, now) - a.base, finish - a.base, self.alpha)
        gain_full = a.weight if self.per_request else base_gain(a.prompt, a.total_out, a.weight, weights)
        budget_dl = np.maximum(np.maximum(dl - now, work), floor)
        dens_dl = gain_full * f_dl / budget_dl

        # Latency (Eq. 3): the next token's due time binds; prompt gain counts until the first token.
        g = a.generated
        due = token_dues(a.arrival, nan_as(a.ttft_s, 0.0), a.tpot_s, g)
        to_next = np.where(t_pref > 0, t_pref, sp.decode_s)
        f_lat = degradations(due - a.arrival, now + to_next - a.arrival, self.alpha)
        rem_out = np.maximum(a.total_out - g, 1.0)
        pending_prompt = np.where(a.started, 0.0, a.prompt)
        gain_lat = (a.weight if self.per_request else base_gain(pending_prompt, rem_out, a.weight, weights)) * f_lat
        span = np.where(a.started, 0.0, self.decode_span_share * (rem_out - 1.0) * a.tpot_s)
        budget_lat = np.maximum(np.maximum(due - now + span, to_next), floor)
        dens_lat = gain_lat / budget_lat

        is_lat = (a.cls == LATENCY) & np.isfinite(a.ttft_s)
        dens = np.where(is_lat, dens_lat, np.where(has_dl, dens_dl, gain_full / np.maximum(work, floor)))
        return np.where(a.cls == BEST_EFFORT, 0.0, dens), t_pref

    def _gain_deadline(self, a: ReqArrays) -> np.ndarray:
        """The deadline a request's gain and its lost-cause test go by (see `stage_deadlines`)."""
        return a.deadline if self.stage_deadlines else a.end_to_end_deadline

    # -- planning ----------------------------------------------------------------------------

    def _arrays(self, view: EngineView) -> ReqArrays:
        return ReqArrays.from_columns(columns_of(view, self._slos), self.default_output_len)

    def plan(self, view: EngineView) -> StepPlan:
        c = columns_of(view, self._slos)
        a = ReqArrays.from_columns(c, self.default_output_len)
        sp = Speeds.from_view(self.perf, view, c)
        dens, t_pref = self._densities(view, a, sp)
        prio = dens
        slo_mask = a.cls != BEST_EFFORT
        if self.fairness > 0 and slo_mask.any():
            prio = dens.copy()
            prio[slo_mask] = fairness_blend(dens[slo_mask], a.attained[slo_mask], self.fairness)

        nw = a.n_waiting
        w_idx = np.arange(nw)
        is_be_w = a.cls[:nw] == BEST_EFFORT
        be_w = w_idx[is_be_w]
        be_w = be_w[lexsort_fast((a.arrival[be_w],))]  # FCFS (stable)
        lost = (
            lost_causes(a, sp, view.now, self._gain_deadline(a), t_pref) & ~is_be_w
            if self.defer_lost
            else np.zeros(nw, dtype=bool)
        )
        slo_w = w_idx[~is_be_w & ~lost]
        slo_w = slo_w[lexsort_fast((a.arrival[slo_w], -prio[slo_w]))]  # densest first
        if self.defer_lost and self.defer_backlogged:
            late = backlogged_first_tokens(a, sp, view.now, slo_w, t_pref)
            lost |= late
            slo_w = slo_w[~late[slo_w]]
        lost_w = w_idx[lost]
        lost_w = lost_w[lexsort_fast((a.arrival[lost_w], -prio[lost_w]))]

        batch = view.max_running_requests
        n_running = a.n - nw
        be_running = int(np.count_nonzero(a.cls[nw:] == BEST_EFFORT))
        reserve = reserved_slots(view.step, self.quantum_steps, self.reserve_share, batch)
        at = reserve_positions(
            len(slo_w), len(be_w), n_running, be_running, view.step, self.quantum_steps, self.reserve_share, batch
        )
        k_be = len(at)
        # The reserved best-effort requests interleaved with the work that can still meet its
        # SLO; lost causes run after it, in the best-effort tier (deferred, not dropped: their
        # degraded gain is still worth leftover capacity).
        head = np.empty(len(slo_w) + k_be, dtype=np.int64)
        is_be_slot = np.zeros(head.size, dtype=bool)
        is_be_slot[at] = True
        head[is_be_slot] = be_w[:k_be]
        head[~is_be_slot] = slo_w
        order_idx = np.concatenate([head, lost_w, be_w[k_be:]]).astype(np.int64)
        plan = StepPlan(
            order=a.rids_at(order_idx),
            best_effort=a.rid_set_at(lost_w),  # the finished plan's tier as it is, not a copy
            order_at=order_idx,
            best_effort_at=lost_w,
        )

        if self.preempt and view.running and nw and quantum_boundary(view.step, self.quantum_steps):
            free = max(0, batch - len(view.running))
            contenders = head[free:][~is_be_slot[free:]]  # SLO work the free slots leave waiting
            plan.preempt = self._victims(view, a, sp, prio, dens, contenders, reserve)
        return plan

    def _victims(
        self,
        view: EngineView,
        a: ReqArrays,
        sp: Speeds,
        prio: np.ndarray,
        dens: np.ndarray,
        contenders: np.ndarray,
        reserve: int,
    ) -> list[str]:
        """Pair the densest blocked waiting requests with the weakest running ones; swap while
        each swap's gain over one quantum beats the batch's loss during the victim's re-prefill."""
        if contenders.size == 0:
            return []
        nw = a.n_waiting
        run = np.arange(nw, a.n)
        is_be = a.cls[run] == BEST_EFFORT
        # Best-effort requests inside the reserve are protected; extra ones go first.
        be_run = run[is_be][(-a.arrival[run][is_be]).argsort(kind="stable")]
        exposed_be = be_run[min(reserve, len(be_run)) :]
        slo_run = run[~is_be]
        slo_run = slo_run[np.lexsort((-a.arrival[slo_run], prio[slo_run]))]
        victims = np.concatenate([exposed_be, slo_run]).astype(np.int64)
        horizon = self.quantum_steps * sp.decode_s
        batch_rate = float(dens[nw:].sum())
        pairs = min(contenders.size, victims.size)
        blocked, victims = contenders[:pairs], victims[:pairs]
        stalls = sp.prefill_time(a.prompt[victims] + a.generated[victims])  # one call
        # Fairness may reorder admission, but a swap must also pay in raw gain terms.
        swaps = swaps_that_pay(
            dens[blocked],
            dens[victims],
            horizon,
            stalls,
            batch_rate,
            self.preempt_margin,
            prio[blocked] > prio[victims],
        )
        return a.rids_at(victims[:swaps])
