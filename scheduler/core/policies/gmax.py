"""JITServe's Grouped Margin Goodput Maximization (GMAX, JITServe §4.2–4.3, Alg. 1).

Priority(r) = goodput(r) / t_gen(r): the goodput still achievable by finishing r per second of
generation it needs (upper-bound length), with goodput inflated by δ per frame waited so nothing
starves. Goodput is request-level by default (a met SLO is worth the request's weight) or, with
objective="tokens", token-level (JITServe §3 leaves the definition to the operator).
Batches are formed by keeping requests with priority >= p · (B-th highest priority),
sorting them by context length and taking the window of B with the largest priority sum
(homogeneous lengths batch faster). p is tuned online by hill-climbing on the goodput observed
per epoch. Running requests can be swapped out only at frame boundaries and only when the gain
beats the stall cost and the App. D.2 margin. Requests past their max_queue_ms are dropped.
Our one addition, urgency: a latency request that can still make its SLO is worth a little more
than deadline work of the same value per second (`latency_urgency`), and more again as its TTFT
window closes (`ttft_urgency`), because it must start now or never while deadline work can wait
for a later frame (both 0 give the paper's priority).
A best-effort request (no SLO) adds nothing to the goodput being maximised, so its deemed goodput
is `best_effort_value` (0 by default) and only δ's aging raises it (JITServe §3, §4.2).
The multi-replica half (§4.3, power-of-K copies) is a routing policy: router/policies/jit.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.batch_limits import MIN_CHUNK, VLLM_CHUNK_STEP_RATIO
from scheduler.core.columns import ViewColumns, rows_among, token_due_of
from scheduler.core.estimates import (
    BEST_EFFORT,
    COMPOUND,
    DEADLINE,
    DEFAULT_OUTPUT_LEN,
    LATENCY,
    OBJECTIVES,
    fairness_blend,
    group_reduce,
    lexsort_fast,
    quantum_boundary,
    swaps_that_pay,
)
from scheduler.core.pass_columns import columns_of
from scheduler.core.perf_model import default_model
from scheduler.core.policies._cutoff_tuner import CutoffTuner
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON, expired_waiting
from scheduler.core.registry import require
from scheduler.core.remaining_work import Speeds, backlogged_first_tokens, latency_on_time_tokens, remaining_work
from scheduler.core.req_arrays import ReqArrays
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView, PerfModel, StepPlan

DEFAULT_CUTOFF_GRID = (0.5, 0.7, 0.8, 0.9, 0.95, 1.0)


def best_window(prio: np.ndarray, length: np.ndarray, size: int, cutoff: float) -> np.ndarray:
    """Alg. 1 lines 12–19: indices of the chosen group (at most `size`), given priorities and
    input lengths. O(n log n): one partition, one sort, one cumulative sum."""
    n = prio.size
    if n == 0 or size <= 0:
        return np.empty(0, dtype=np.int64)
    if n <= size:
        return np.arange(n)
    bp = -np.partition(-prio, size - 1)[size - 1]  # the B-th highest priority
    cand = (prio >= bp * cutoff).nonzero()[0]
    if cand.size <= size:
        return cand
    cand = cand[np.lexsort((-prio[cand], length[cand]))]
    sums = np.cumsum(np.concatenate([[0.0], prio[cand]]))
    window = sums[size:] - sums[:-size]
    start = int(np.argmax(window))  # first maximal window: shortest inputs on ties
    return cand[start : start + size]


@dataclass(frozen=True)
class GmaxParams:
    cutoff: float = 0.95  # p against the B-th highest priority (the tuner's start)
    tune_cutoff: bool = True
    cutoff_grid: tuple[float, ...] = DEFAULT_CUTOFF_GRID
    tune_epoch_frames: int = 10
    aging_delta: float = 1.0  # δ: goodput inflation per frame waited
    frame_steps: int = 50  # steps per preemption frame
    preempt: bool = True
    preempt_margin: float = 0.1
    enforce_max_queue: bool = True
    fairness: float = 0.0
    default_output_len: float = DEFAULT_OUTPUT_LEN
    # goodput(r): 1 (its weight) if it can still meet its SLO, as /slo/status attainment counts;
    # "tokens": its on-time tokens (JITServe's token-level goodput, which under overload
    # favours few long requests and starves latency work)
    objective: str = "requests"
    # Judge a compound stage by its learned sub-deadline φ(s)·D (JITServe §4.1) rather than its
    # program's deadline. GMAX's priority has no urgency term, so the sub-deadline only makes a
    # stage worthless sooner (benchmarks/RESULTS.md).
    stage_deadlines: bool = False
    # A latency request that can still meet its SLO is worth (1 + this) x its goodput: it must be
    # served now or never, deadline work of the same cost keeps. Without it GMAX ranks the two by
    # cost alone and starves latency requests under overload. It sets the balance between the
    # classes (larger keeps more latency requests, fewer in all; 0 is the paper's priority). Not
    # tuned online like the cutoff: deadline work pays back within an epoch, the latency work a
    # tuner starves does not show as a loss there. The sweep: benchmarks/RESULTS.md.
    latency_urgency: float = 0.05
    # A latency request waiting for its first token is worth this x the share of its TTFT window
    # already gone, over and above latency_urgency. Value per second of work alone ignores how
    # soon a window closes: near capacity GMAX started deadline work, or short answers, inside
    # the windows of latency requests it then lost. A request about to miss its first token
    # outranks one that can wait (EDF's insight), one with its whole window ahead ranks by value
    # per second as in the paper (0: off).
    ttft_urgency: float = 8.0
    # The most prompt tokens one step prefills, over what the perf model sizes: as many as keep
    # the mixed step within this many plain decode steps of the running batch (0: off).
    # JITServe runs on vLLM's chunked prefill, whose default token budget was tuned for the best
    # ITL/TTFT balance (vllm-project/vllm#4580) on an A100; the default is the step time that
    # budget has there (benchmarks/RESULTS.md, GMAX's parameters). Stated in time, the budget
    # carries over to a card that prefills faster than it decodes, which gets more tokens. Our
    # reading: small prefills pace how fast GMAX starts requests, and its length bounds err long.
    chunk_step_ratio: float = VLLM_CHUNK_STEP_RATIO
    # A step whose prefill starts a first token at risk runs without the decodes where their
    # slack allows (batch_limits.prefill_alone, as slos and tempo): with `defer_backlogged`
    # keeping the first tokens the queue makes late out of the way, the shorter step saves the
    # ones a mixed step would make late (the sweep: benchmarks/RESULTS.md).
    prefill_alone: bool = True
    # The same budget in tokens (0: none), e.g. 512 for vLLM's default as it is.
    chunk_cap: int = 0
    # goodput(r) of a best-effort request, as a share of a met SLO request's. The objective
    # (requests or tokens that meet their SLO, as /slo/status counts) has no term for them, so
    # 0 leaves them to δ's aging, JITServe's guard against their starvation (§4.2), and they run
    # on what the SLO work leaves. Worth a met request from arrival (1, ours before), a short
    # best-effort request outranked every longer latency request, and under a per-step prefill
    # budget those latency requests waited past their TTFT (benchmarks/RESULTS.md).
    best_effort_value: float = 0.0
    # A waiting SLO request with no goodput left (it can no longer meet its SLO) runs in the
    # best-effort tier, after the work that can, where the plan path holds it while SLO work is in
    # the engine (as Tempo defers its lost causes). Ranked among the rest, δ's aging lifted such
    # requests back into the batch, and near capacity their prefills cost the first tokens of
    # long answers that could still make theirs (benchmarks/RESULTS.md, the sweep).
    defer_lost: bool = True
    # With defer_lost: a waiting latency request whose first token cannot come by its TTFT
    # behind the prefills ahead of it in GMAX's order (at full speed) is lost too
    # (remaining_work.backlogged_first_tokens). Judged alone, each request of a burst fits its
    # window; GMAX started them all and missed the later ones' first tokens by a few steps. In
    # the tier, the requests behind them make theirs, as SLOs-Serve's admission declines what
    # the queue ahead makes late (the sweep: benchmarks/RESULTS.md).
    defer_backlogged: bool = True

    def __post_init__(self) -> None:
        require(0.0 < self.cutoff <= 1.0, "cutoff", "must be in (0, 1]", self.cutoff)
        require(self.objective in OBJECTIVES, "objective", f"must be one of {OBJECTIVES}", self.objective)
        require(0.0 <= self.fairness <= 1.0, "fairness", "must be in [0, 1]", self.fairness)
        require(self.latency_urgency >= 0.0, "latency_urgency", "must be >= 0", self.latency_urgency)
        require(self.ttft_urgency >= 0.0, "ttft_urgency", "must be >= 0", self.ttft_urgency)
        require(self.best_effort_value >= 0.0, "best_effort_value", "must be >= 0", self.best_effort_value)
        require(self.chunk_step_ratio >= 0.0, "chunk_step_ratio", "must be >= 0", self.chunk_step_ratio)
        require(
            self.chunk_cap == 0 or self.chunk_cap >= MIN_CHUNK,
            "chunk_cap",
            f"must be 0 or >= {MIN_CHUNK}",
            self.chunk_cap,
        )


class GmaxPolicy:
    name = "gmax"
    slo_levers = True

    def __init__(self, params: GmaxParams = GmaxParams(), perf_model: PerfModel | None = None) -> None:
        self.perf = perf_model if perf_model is not None else default_model()
        self.aging_delta = params.aging_delta
        self.frame_steps = params.frame_steps
        self.preempt = params.preempt
        self.preempt_margin = params.preempt_margin
        self.enforce_max_queue = params.enforce_max_queue
        self.fairness = params.fairness
        self.default_output_len = params.default_output_len
        self.per_request = params.objective == "requests"
        self.stage_deadlines = params.stage_deadlines
        self.latency_urgency = params.latency_urgency
        self.ttft_urgency = params.ttft_urgency
        self.chunk_cap = params.chunk_cap or None
        self.chunk_step_ratio = params.chunk_step_ratio or None
        self.prefill_alone = params.prefill_alone  # read by plan_path.settings_for
        self.best_effort_value = params.best_effort_value
        self.defer_lost = params.defer_lost
        self.defer_backlogged = params.defer_backlogged
        grid = sorted(set(params.cutoff_grid) | {params.cutoff})
        epoch_steps = params.tune_epoch_frames * params.frame_steps
        self.tuner = CutoffTuner(grid, params.cutoff, epoch_steps=epoch_steps, enabled=params.tune_cutoff)
        # Requests seen running last step -> (goodput if they finish now, deadline or +inf).
        self._seen: _Seen | None = None  # the running requests of the last pass
        self._removed: set[str] = set()
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    @property
    def cutoff(self) -> float:
        return self.tuner.current

    # -- scoring -----------------------------------------------------------------------------

    def priorities(self, view: EngineView, a: ReqArrays | None = None, sp: Speeds | None = None) -> np.ndarray:
        """goodput / t_gen per request (waiting first, then running), aged by δ per frame."""
        a = a if a is not None else self._arrays(view)
        sp = sp if sp is not None else Speeds.from_view(self.perf, view)
        return self._scores(view, a, sp)[0]

    def _scores(self, view: EngineView, a: ReqArrays, sp: Speeds) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(priority, goodput still achievable before aging, remaining prefill seconds) per request."""
        now = view.now
        t_pref, t_gen = remaining_work(a, sp)
        t_gen = np.maximum(t_gen, sp.decode_s)
        tokens = a.prompt + a.total_out
        # Request-level goodput is token-level goodput per token of the request: a request is
        # worth its weight, and δ ages it by the same share of its value as in token mode.
        unit = 1.0 / tokens if self.per_request else 1.0

        goodput = a.weight * (1.0 if self.per_request else tokens)
        goodput = np.where(a.cls == BEST_EFFORT, goodput * self.best_effort_value, goodput)  # no SLO, no gate
        deadline = a.deadline if self.stage_deadlines else a.end_to_end_deadline
        has_dl = np.isfinite(deadline) & ((a.cls == DEADLINE) | (a.cls == COMPOUND))
        finish = now + group_reduce(t_gen, a.group, "max")  # a stage's calls run side by side
        goodput = np.where(has_dl, np.where(finish <= deadline + 1e-9, goodput, 0.0), goodput)
        first_emit = now + np.where(t_pref > 0, t_pref, sp.decode_s)
        lat = (a.cls == LATENCY) & np.isfinite(a.ttft_s)
        on_time = latency_on_time_tokens(a, first_emit, sp.decode_s)
        if self.per_request:  # met only if every remaining token is on time
            remaining = np.maximum(a.total_out, a.generated + 1.0) - a.generated
            on_time = np.where(on_time >= remaining, 1.0, 0.0)
        urgency = self._urgency(a, first_emit, lat)
        goodput = np.where(lat, a.weight * on_time * urgency, goodput)

        # Compound: a stage is scored as a whole (aggregated goodput over aggregated work).
        comp = a.group >= 0
        if comp.any():
            goodput = np.where(comp, group_reduce(goodput, a.group, "sum"), goodput)
            t_gen = np.where(comp, group_reduce(t_gen, a.group, "sum"), t_gen)

        frame_s = max(self.frame_steps, 1) * sp.decode_s
        aged = goodput + self.aging_delta * unit * np.maximum(now - a.arrival, 0.0) / frame_s
        prio = aged / t_gen
        if self.fairness > 0:
            prio = fairness_blend(prio, a.attained, self.fairness)
        return prio, goodput, t_pref

    def _urgency(self, a: ReqArrays, first_emit: np.ndarray, lat: np.ndarray) -> np.ndarray | float:
        """Goodput multiplier of the latency requests `lat`: 1 + latency_urgency, plus
        ttft_urgency x the share of the TTFT window gone by the time its first token can come."""
        base = 1.0 + self.latency_urgency
        if self.ttft_urgency <= 0:
            return base
        window = np.where(lat, a.ttft_s, 1.0)  # finite where lat; elsewhere unused
        gone = np.clip((first_emit - a.arrival) / window, 0.0, 1.0)
        return base + self.ttft_urgency * np.where(lat & (a.generated == 0), gone, 0.0)

    # -- planning ----------------------------------------------------------------------------

    def _arrays(self, view: EngineView) -> ReqArrays:
        return ReqArrays.from_columns(columns_of(view, self._slos), self.default_output_len)

    def plan(self, view: EngineView) -> StepPlan:
        plan = StepPlan()
        c = columns_of(view, self._slos)
        a = ReqArrays.from_columns(c, self.default_output_len)
        if self.enforce_max_queue:
            nw = a.n_waiting
            expired = expired_waiting(c, view.now)
            if expired.any():
                rids = a.rids
                plan.drop = {rids[i]: QUEUE_TIMEOUT_REASON for i in expired.nonzero()[0].tolist()}
                kept = np.fromiter([rid not in plan.drop for rid in rids[:nw]], dtype=bool, count=nw)
                keep = np.concatenate([kept.nonzero()[0], np.arange(nw, a.n)])
                a = a.take(keep, int(np.count_nonzero(kept)))
        running = list(view.running)
        self._observe(view, c)

        sp = Speeds.from_view(self.perf, view, c)
        prio, worth, t_pref = self._scores(view, a, sp)
        length = a.prompt + a.generated
        nw = a.n_waiting
        batch = view.max_running_requests
        cutoff = self.tuner.current
        at_frame = quantum_boundary(view.step, self.frame_steps)

        if at_frame and self.preempt and running and nw:
            group = best_window(prio, length, batch, cutoff)
        else:
            free = max(0, batch - len(running))
            group = best_window(prio[:nw], length[:nw], free, cutoff)
        chosen = np.zeros(a.n, dtype=bool)
        chosen[group] = True
        # Chosen group first (densest first inside it), then everyone else by priority; ties
        # by arrival, then queue position.
        parts = []
        for part in (chosen[:nw].nonzero()[0], (~chosen[:nw]).nonzero()[0]):
            parts.append(part[lexsort_fast((a.arrival[part], -prio[part]))])
        order_idx = np.concatenate(parts)
        positions = a.n_waiting == len(view.waiting)  # nothing dropped: positions in the view's queue
        if self.defer_lost:
            lost = worth[:nw] <= 0
            if self.defer_backlogged:
                lost |= backlogged_first_tokens(a, sp, view.now, order_idx, t_pref)
            order_idx = self._defer_lost(plan, a, lost, order_idx, positions)
        plan.order = a.rids_at(order_idx)
        if positions:
            plan.order_at = order_idx

        if at_frame and self.preempt and running and nw:
            plan.preempt = self._victims(a, sp, prio, chosen, batch)
        self._removed = set(plan.drop) | set(plan.preempt)
        self.tuner.step(view.step, view.now)
        return plan

    @staticmethod
    def _defer_lost(
        plan: StepPlan, a: ReqArrays, lost: np.ndarray, order_idx: np.ndarray, positions: bool
    ) -> np.ndarray:
        """`order_idx` with the waiting SLO requests `lost` (a mask over them) moved to its end, in the tier."""
        nw = a.n_waiting
        lost = lost & (a.cls[:nw] != BEST_EFFORT)
        if not lost.any():
            return order_idx
        at = lost.nonzero()[0]
        plan.best_effort = a.rid_set_at(at)
        if positions:
            plan.best_effort_at = at
        in_order = lost[order_idx]
        return np.concatenate([order_idx[~in_order], order_idx[in_order]])

    def _victims(self, a: ReqArrays, sp: Speeds, prio: np.ndarray, chosen: np.ndarray, batch: int) -> list[str]:
        nw = a.n_waiting
        n_running = a.n - nw
        entrants = chosen[:nw].nonzero()[0]
        entrants = entrants[(-prio[entrants]).argsort(kind="stable")]
        blocked = entrants[max(0, batch - n_running) :]
        if blocked.size == 0:
            return []
        run = np.arange(nw, a.n)
        out_of_group = run[~chosen[nw:]]
        out_of_group = out_of_group[prio[out_of_group].argsort(kind="stable")]  # weakest first
        horizon = self.frame_steps * sp.decode_s
        batch_rate = float(prio[nw:].sum())
        pairs = min(blocked.size, out_of_group.size)
        blocked, out_of_group = blocked[:pairs], out_of_group[:pairs]
        stalls = sp.prefill_time(a.prompt[out_of_group] + a.generated[out_of_group])  # one call, not one per pair
        swaps = swaps_that_pay(prio[blocked], prio[out_of_group], horizon, stalls, batch_rate, self.preempt_margin)
        return a.rids_at(out_of_group[:swaps])

    # -- online cutoff tuning ----------------------------------------------------------------

    def _observe(self, view: EngineView, c: ViewColumns) -> None:
        """Estimate realised goodput without engine hooks: a request that was running and has
        left both queues (and that we did not drop or preempt) finished around `now`."""
        nw = c.n_waiting
        run = slice(nw, None)
        seen = self._seen
        gone = seen.gone(c) if seen is not None else []
        if seen is not None and gone:
            values, dues = seen.worth.of(np.array(gone, dtype=np.int64))
            for i, value, by in zip(gone, values.tolist(), dues.tolist(), strict=True):
                if seen.rids[i] not in self._removed and view.now <= by + 1e-9:
                    self.tuner.reward(value)
        # Only the requests that leave are ever valued, a few a pass: the running columns are
        # kept as this pass read them, and the worth is worked out for the ones gone next pass.
        booking = _Worth(c, view.now, self.per_request, self.best_effort_value, self.stage_deadlines)
        self._seen = _Seen(c.rid_array[run], booking, c.row_keys(), nw)


class _Worth:
    """What each running request of one pass is worth if it finishes now, and by when: a latency
    request one met SLO (or its tokens so far) while its next token is on time, others their
    whole context; due at its deadline (+inf: none). Read from that pass's columns, kept as
    they were (a pass's arrays are its own; nothing writes into them)."""

    def __init__(self, c: ViewColumns, now: float, per_request: bool, best_effort_value: float, stage: bool) -> None:
        run = slice(c.n_waiting, None)
        self.now, self.per_request, self.best_effort_value = now, per_request, best_effort_value
        self.cls, self.generated, self.weight = c.cls[run], c.generated[run], c.weight[run]
        self.arrival, self.ttft_ms, self.tpot_ms = c.arrival[run], c.ttft_ms[run], c.tpot_ms[run]
        self.prompt = None if per_request else c.prompt[run]
        self.deadline = (c.deadline if stage else c.end_to_end_deadline)[run]

    def of(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(worth, due) of the requests at positions `at` among the running."""
        cls, generated, weight = self.cls[at], self.generated[at], self.weight[at]
        next_due = token_due_of(self.arrival[at], self.ttft_ms[at], self.tpot_ms[at], generated)  # nan: never late
        late = (cls == LATENCY) & (self.now > next_due)
        if self.prompt is None:
            worth = weight.astype(float)
        else:
            worth = np.where(cls == LATENCY, weight * (generated + 1.0), weight * (self.prompt[at] + generated + 1.0))
        worth = np.where(late, 0.0, worth)
        worth = np.where(cls == BEST_EFFORT, worth * self.best_effort_value, worth)  # as priorities() counts it
        deadline = self.deadline[at]
        has_due = ((cls == DEADLINE) | (cls == COMPOUND)) & ~np.isnan(deadline)
        return worth, np.where(has_due, deadline, np.inf)


class _Seen:
    """The running requests of one pass, and what each is worth if it finishes, by when."""

    def __init__(self, rids: np.ndarray, worth: _Worth, keys: tuple[int, np.ndarray] | None, nw: int) -> None:
        self.rids, self.worth = rids, worth
        self.epoch = keys[0] if keys is not None else None
        self.rows = keys[1][nw:] if keys is not None else None

    def booked(self) -> dict[str, tuple[float, float]]:
        """rid -> (worth, due), as the tuner is rewarded from."""
        worth, due = self.worth.of(np.arange(len(self.rids)))
        return dict(zip(self.rids.tolist(), zip(worth.tolist(), due.tolist(), strict=True), strict=True))

    def gone(self, c: ViewColumns) -> list[int]:
        """Which of them are neither running nor waiting now (an engine retraction is not a
        finish): by row where the engine keeps rows (two numpy calls), else by rid."""
        if not len(self.rids):
            return []
        keys = c.row_keys()
        if keys is not None and self.rows is not None and keys[0] == self.epoch:
            return (~rows_among(self.rows, keys[1])).nonzero()[0].tolist()
        running = set(c.rid_array[c.n_waiting :].tolist())
        left = [i for i, rid in enumerate(self.rids.tolist()) if rid not in running]
        if not left:
            return []
        waiting = set(c.rids[: c.n_waiting])
        return [i for i in left if self.rids[i] not in waiting]
