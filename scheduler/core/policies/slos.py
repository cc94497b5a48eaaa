"""SLOs-Serve: soft admission by the multi-SLO DP every step, dynamic batch size, and
SLO-adaptive speculation length.

Admitted waiting requests go first in prefill-deadline order and stay admitted (forced) on
later steps while they wait; declined ones go to the best-effort tier (StepPlan.best_effort),
which runs on leftover budget and is reconsidered every step. Only the `max_candidates`
most urgent undecided requests enter the DP each step (the paper's 0–10 new requests per
invocation), so a deep queue costs one linear scan, not a bigger DP.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scheduler.core.batch_limits import MIN_CHUNK, banked_slack_chunk
from scheduler.core.columns import ViewColumns, rows_among
from scheduler.core.estimates import COMPOUND, DEADLINE, DEFAULT_OUTPUT_LEN, LATENCY
from scheduler.core.pass_columns import columns_of
from scheduler.core.perf_model import default_model
from scheduler.core.position_rids import PositionRids
from scheduler.core.registry import require
from scheduler.core.row_reads import SloTable
from scheduler.core.slos_serve.arrival_bound import ArrivalBoundBudget, arrival_chunk
from scheduler.core.slos_serve.batch_formation import EPS
from scheduler.core.slos_serve.dp import DpItem
from scheduler.core.slos_serve.items import MIN_DERIVED_TPOT_S, Demand, demand, derived_tiers, expected_outputs
from scheduler.core.slos_serve.soft_admission import admit
from scheduler.core.slos_serve.spec_length import Tier, optimize_spec_lengths
from scheduler.core.types import EngineView, PerfModel, RequestView, StepPlan
from scheduler.core.work_budget import WorkBudget, units_for_ms


def _by_key(key: np.ndarray, rids: list[str] | np.ndarray, idx: np.ndarray) -> np.ndarray:
    """The positions `idx` sorted as `sorted(zip(key, rid))` sorts their requests: by key, ties
    by rid (then by position). Only the runs of equal keys (a compound stage's calls share
    their deadline) are sorted again. `rids`: a list, or the columns' object array (the pass
    then makes no list of every rid)."""
    order = idx[key[idx].argsort(kind="stable")]
    ranked = key[order]
    ties = (ranked[1:] == ranked[:-1]).nonzero()[0]
    if ties.size:  # the slots of every run, refilled in one sort of their requests
        in_run = np.zeros(len(order), dtype=bool)
        in_run[ties] = in_run[ties + 1] = True
        slots = in_run.nonzero()[0]
        # rids are unique, so (key, rid) is the whole tie-break; one lexsort over them as a
        # string column, not a Python sort of tuples (a burst of equal deadlines ties them all)
        tied = order[slots]
        names = np.array(rids[tied].tolist() if isinstance(rids, np.ndarray) else [rids[i] for i in tied.tolist()])
        order[slots] = order[slots][np.lexsort((names, ranked[slots]))]
    return order


def _tally(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """np.unique(values, return_counts=True) for a few distinct values, without its overhead."""
    if values.size == 0:
        return values, np.zeros(0, dtype=np.int64)
    ranked = np.sort(values)
    starts = np.append(0, (ranked[1:] != ranked[:-1]).nonzero()[0] + 1)
    return ranked[starts], np.diff(np.append(starts, ranked.size))


@dataclass
class _Queue:
    """The waiting queue as one step's admission sees it, as positions in view.waiting."""

    undecided: np.ndarray  # by prefill deadline, ties by rid
    no_target: np.ndarray  # no prefill deadline: by arrival, ties by rid
    declined: np.ndarray  # prefill deadline already past, in queue order
    forced: list[tuple[int, Demand]]  # admitted earlier and still waiting, in queue order


@dataclass(frozen=True)
class _SlackChunks:
    """`SlosServePolicy._slack_chunks`: prefill tokens beyond the shape's budget the DP may count
    (`credit`), the chunk that carries them (`longer`), and the chunk the running requests'
    slack allows at most (`cap`; None: no bound)."""

    credit: float = 0.0
    longer: int = 0
    cap: int | None = None


@dataclass(frozen=True)
class SlosServeParams:
    acceptance_rate: float | None = None  # speculation's per-token acceptance; None: no speculation
    max_candidates: int = 16  # undecided requests entering the DP per step
    max_spec_steps: int = 8
    default_output_tokens: int = DEFAULT_OUTPUT_LEN
    deadline_prefill_share: float = 0.2
    idle_batch_s: float = 0.05
    # A deadline's derived TPOT under this many single-decoder steps is not protected (it
    # decodes without a target): holding every batch that small for one request costs more
    # admissions than it saves (the floor's sweep: benchmarks/RESULTS.md).
    derived_tpot_floor_steps: float = 4.0
    # The DP's hard budget per pass, in milliseconds of search on the slowest host
    # (scheduler/core/work_budget.py; None: unbounded). When it runs out the pass keeps the
    # earlier admissions that still wait, admits nothing new, and counts a budget fallback.
    search_budget_ms: float | None = 4.0
    # A batch's prefill is at most what alone takes this share of the tightest TTFT among the
    # requests in view (None: the tightest TPOT alone sizes batches, Alg. 2). Under SGLang's
    # overlap schedule a request arriving during a pass is first planned after the next one:
    # batches as long as a loose TPOT allows spend a short prompt's TTFT before admission
    # sees it (arrival_bound.py; the share's sweep: benchmarks/RESULTS.md, SLOs-Serve headline).
    arrival_batch_share: float | None = 1.5
    # This step's chunk follows the running requests' slack, as every SLO policy's does
    # (batch_limits): longer than Alg. 2's batch as far as their banked slack allows (each
    # on-time one's next token still on time), which the DP counts once and which runs only
    # where the admitted set needs it; shorter where a running deadline's pace needs it though
    # it sits under the derived-TPOT floor. Alg. 2 sizes every batch by the tightest TPOT alone:
    # under a TPOT near the decode step that leaves prefill nothing even while the decoders run
    # ahead, and a deadline without a tier gets no say (the sweep: benchmarks/RESULTS.md).
    banked_slack: bool = True
    # A step whose prefill starts a first token at risk runs without the decodes where their
    # slack allows (batch_limits.prefill_alone): a shorter step, as vLLM's prefill-only passes,
    # for prompts whose TTFT is a few passes (SLOs-Serve's ChatBot and Reasoning; the sweep and
    # the scenarios' capacities: benchmarks/RESULTS.md).
    prefill_alone: bool = True

    def __post_init__(self) -> None:
        require(
            self.derived_tpot_floor_steps >= 0.0,
            "derived_tpot_floor_steps",
            "must be >= 0",
            self.derived_tpot_floor_steps,
        )
        ms = self.search_budget_ms
        require(ms is None or ms > 0.0, "search_budget_ms", "must be > 0 or None", ms)
        share = self.arrival_batch_share
        require(share is None or share > 0.0, "arrival_batch_share", "must be > 0 or None", share)


class SlosServePolicy:
    name = "slos"
    slo_levers = True

    def __init__(self, params: SlosServeParams = SlosServeParams(), perf_model: PerfModel | None = None) -> None:
        self.perf: PerfModel = perf_model if perf_model is not None else default_model()
        self.alpha = params.acceptance_rate
        self.max_candidates = params.max_candidates
        self.max_spec = params.max_spec_steps
        self.default_output = params.default_output_tokens
        self.prefill_share = params.deadline_prefill_share
        self.idle = params.idle_batch_s
        self.floor_steps = params.derived_tpot_floor_steps
        self.work_units = units_for_ms(params.search_budget_ms)
        self.arrival_share = params.arrival_batch_share
        self.banked_slack = params.banked_slack
        self.prefill_alone = params.prefill_alone  # read by plan_path.settings_for
        self.budget_fallbacks = 0  # passes whose DP ran out of budget (/slo/status)
        self._admitted: set[str] = set()  # admitted earlier, still waiting: forced
        self._admitted_rows: tuple[int, np.ndarray] | None = None  # their rows (ViewColumns.row_keys)
        self._floor = MIN_DERIVED_TPOT_S
        self._spec_memo: dict[tuple, int] = {}  # draft length per decoder mix (changes slowly)
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    def _demand(self, r: RequestView, now: float) -> Demand | None:
        return demand(r, now, self.default_output, self.prefill_share, self._floor)

    def plan(self, view: EngineView) -> StepPlan:
        now = view.now
        kv = max(0, view.total_kv_tokens - view.free_kv_tokens)
        # A few times the fastest batch there is (one decoder of average context): a deadline
        # needing faster decoding than this must not set everyone's batch time.
        kv_per = kv // max(1, len(view.running))
        self._floor = max(MIN_DERIVED_TPOT_S, self.floor_steps * self.perf.step_time(0, 1, kv_per))
        c = columns_of(view, self._slos)
        decoding, prefilling, paced_tpot = self._running_demands(view, c)
        queue = self._triage(view, c)
        rids = c.rid_array
        candidates = queue.undecided[: max(0, self.max_candidates)].tolist()
        demands = {i: self._demand(view.waiting[i], now) for i in candidates}
        forced = queue.forced

        known = decoding[~np.isnan(decoding)]
        if self.alpha is None and known.size:
            # A batch's shape depends only on the tightest tier and the number of decoders
            # (TierBudget.canonical), so one tier stands for every running target: the same
            # decisions, without a DP tier per distinct target. Speculation's length choice
            # weighs every tier, so it keeps them.
            targets, per_target = known.min(keepdims=True), np.array([known.size])
        else:
            targets, per_target = _tally(known)
        tiers = sorted(
            set(targets.tolist())
            | {d.tpot for _, d in prefilling + forced if d.tpot is not None}
            | {d.tpot for d in demands.values() if d is not None and d.tpot is not None}
        )
        index = {t: i for i, t in enumerate(tiers)}
        counts = [0] * (len(tiers) + 1)
        for t, n in zip(targets.tolist(), per_target.tolist(), strict=True):
            counts[index[t]] = n
        counts[-1] = int(np.count_nonzero(np.isnan(decoding)))

        def item(r: RequestView, d: Demand, forced_item: bool, mem: int, started: bool = False) -> DpItem:
            tier = index[d.tpot] if d.tpot is not None else -1
            return DpItem(r.rid, d.deadline, d.prefill_tokens, mem, tier, r.slo.weight, forced_item, started)

        # Running prefills already hold their memory; admitted-but-waiting ones do not yet.
        items = [item(r, d, True, 0, started=True) for r, d in prefilling]
        items += [item(view.waiting[i], d, True, d.mem_tokens) for i, d in forced]
        items += [item(view.waiting[i], d, False, d.mem_tokens) for i, d in demands.items() if d is not None]

        spec = None
        if self.alpha is not None and tiers and sum(counts):
            # One draft length per step (SGLang verifies one length per batch), chosen for
            # the decoders running now and then held fixed across the DP's states.
            live = [Tier(t, n) for t, n in zip(tiers, counts[:-1], strict=True)] + [Tier(math.inf, counts[-1])]
            key = (tuple(live), kv >> 12, view.chunk_size)
            spec = self._spec_memo.get(key)
            if spec is None:
                if len(self._spec_memo) > 256:
                    self._spec_memo.clear()
                choice = optimize_spec_lengths(self.perf, live, self.alpha, kv, self.max_spec, view.chunk_size, True)
                spec = self._spec_memo[key] = choice.steps if choice is not None else 0
        budget = ArrivalBoundBudget(
            self.perf,
            tiers,
            arrival_chunk(self.perf, c.ttft_ms, self.arrival_share),
            kv_tokens=kv,
            chunk_cap=view.chunk_size,
            idle_batch_s=self.idle,
            alpha=self.alpha,
            max_spec=self.max_spec,
            spec_steps=spec,
        )
        slack = self._slack_chunks(view, c, budget, tuple(counts), paced_tpot)
        # Admissions the engine could not start on time make the forced set infeasible: then the
        # most urgent items are decided again (soft_admission) and the rest wait in the
        # best-effort tier.
        result = admit(
            items,
            budget,
            tuple(counts),
            now,
            view.free_kv_tokens,
            view.max_running_requests,
            fallback_items=len(prefilling) + self.max_candidates,
            work=WorkBudget(self.work_units),
            credit=slack.credit,
        )
        # A longer batch is a longer wait for every arrival (the overlap schedule plans them a
        # pass late): it runs only where its extra prefill admits more.
        banked_chunk = slack.longer if result.credit_used else 0
        self.budget_fallbacks += result.exhausted
        # The DP names waiting requests by rid: all of them were forced or candidates.
        at = {rids[i]: i for i in [*candidates, *(i for i, _ in forced)]}
        admitted = np.array([at[rid] for rid in result.admitted if rid in at], dtype=np.int64)
        declined = np.concatenate(
            [queue.declined, np.array([at[rid] for rid in result.declined if rid in at], dtype=np.int64)]
        )
        rest = queue.undecided[len(candidates) :]
        order_at = np.concatenate([admitted, rest, queue.no_target, declined])
        self._remember(c, admitted)
        plan = StepPlan(
            order=c.rid_array[order_at].tolist(),
            best_effort=PositionRids(c.rid_array, declined),  # kept as it is by the plan path
            **self._batch_shape(budget, tuple(counts), view, kv, banked_chunk, slack.cap),
        )
        plan.order_at, plan.best_effort_at = order_at, declined
        return plan

    def _remember(self, c: ViewColumns, admitted: np.ndarray) -> None:
        """The admitted requests still waiting are forced on later steps: kept by rid, and by row
        where the engine keeps rows, which the next step finds them by."""
        self._admitted = set(c.rid_array[admitted].tolist())
        keys = c.row_keys()
        self._admitted_rows = (keys[0], keys[1][admitted]) if keys is not None else None

    def _running_demands(
        self, view: EngineView, c: ViewColumns
    ) -> tuple[np.ndarray, list[tuple[RequestView, Demand]], float]:
        """(each decoder's TPOT tier, nan for none; the running requests still prefilling with
        their demands): `demand`'s tiers, read off the columns where they are the SLO's own."""
        now, nw = view.now, c.n_waiting
        run = slice(nw, None)
        cls, started, be_tier = c.cls[run], c.started[run], c.be_tier[run]
        decoders = started & ~be_tier  # declined and running: decodes without a target
        latency = decoders & (cls == LATENCY) & ~np.isnan(c.ttft_ms[run] + c.tpot_ms[run])
        left = c.deadline[run] - now  # nan: no deadline
        # A deadline with time left decodes at its remaining time per remaining token.
        paced = decoders & ((cls == DEADLINE) | (cls == COMPOUND)) & (left > 0)
        decoding = np.full(len(cls), np.nan)
        decoding[latency] = c.tpot_ms[run][latency] / 1000.0
        if paced.any():
            rows = nw + paced.nonzero()[0]
            out = expected_outputs(c.predicted[rows], c.max_new[rows], c.generated[rows], self.default_output)
            decoding[paced] = derived_tiers(left[paced] / out, self._floor)
        # a derived tier is a pace: nothing is banked ahead of it, so it bounds a banked batch
        paced_tpot = float(np.fmin.reduce(decoding[paced], initial=math.nan)) if paced.any() else math.nan
        prefilling: list[tuple[RequestView, Demand]] = []
        pending = (~started).nonzero()[0]
        keep = np.ones(len(cls), dtype=bool)
        for i in pending.tolist():
            r = view.running[i]
            if (d := self._demand(r, now)) is not None:
                prefilling.append((r, d))
                keep[i] = False  # decodes nothing yet
        return decoding[keep], prefilling, paced_tpot

    def _triage(self, view: EngineView, c: ViewColumns) -> _Queue:
        """The waiting queue by prefill deadline (`prefill_deadline`, on the columns): none
        (by arrival), already past (declined), admitted earlier (forced), the rest by deadline."""
        now, nw = view.now, c.n_waiting
        w = slice(0, nw)
        cls = c.cls[w]
        share = self.prefill_share
        end = now + share * np.maximum(0.0, c.deadline[w] - now)  # nan: no deadline
        due = np.where((cls == DEADLINE) | (cls == COMPOUND), end, math.nan)
        due = np.where(cls == LATENCY, c.token_due(np.zeros(nw), w), due)
        rids = c.rid_array
        open_ = due > now
        forced: list[tuple[int, Demand]] = []
        for i in self._admitted_waiting(c):
            if open_[i] and (d := self._demand(view.waiting[i], now)) is not None:
                forced.append((i, d))
                open_[i] = False
        return _Queue(
            undecided=_by_key(due, rids, open_.nonzero()[0]),
            no_target=_by_key(c.arrival, rids, np.isnan(due).nonzero()[0]),
            declined=(due <= now).nonzero()[0],
            forced=forced,
        )

    def _admitted_waiting(self, c: ViewColumns) -> list[int]:
        """The positions of the requests admitted earlier that still wait, in queue order: found
        by row when the rows are the ones they were admitted under (a few numpy calls), else by
        rid (a Python step per waiting request)."""
        if not self._admitted:
            return []
        nw, keys, last = c.n_waiting, c.row_keys(), self._admitted_rows
        if keys is not None and last is not None and keys[0] == last[0]:
            found = rows_among(keys[1][:nw], last[1]).nonzero()[0]
            return [
                i for i, rid in zip(found.tolist(), c.rid_array[found].tolist(), strict=True) if rid in self._admitted
            ]
        rids = c.rids
        return [i for i in range(nw) if rids[i] in self._admitted]

    def _slack_chunks(
        self, view: EngineView, c: ViewColumns, budget: ArrivalBoundBudget, counts: tuple[int, ...], paced_tpot: float
    ) -> _SlackChunks:
        """What the running requests' slack allows this step's chunk (the levers' rule:
        batch_limits.banked_slack_chunk, within slos's own derived tiers): a longer batch than
        the shape's where they are ahead of schedule (the extra prefill the DP may count), a
        shorter one where a running request needs it."""
        if not self.banked_slack or self.alpha is not None:
            return _SlackChunks()
        shape = budget(counts)
        if not shape.stable:
            return _SlackChunks()
        fit = banked_slack_chunk(view, self.perf, c, math.inf if math.isnan(paced_tpot) else paced_tpot)
        if fit is None:
            return _SlackChunks()
        longer = min(float(fit), budget.chunk_bound, float(view.chunk_size))
        extra = longer - shape.prefill_budget
        return (
            _SlackChunks(extra, int(longer), max(fit, MIN_CHUNK))
            if extra >= 1.0
            else _SlackChunks(cap=max(fit, MIN_CHUNK))
        )

    def _batch_shape(
        self,
        budget: ArrivalBoundBudget,
        counts: tuple[int, ...],
        view: EngineView,
        kv: int,
        banked_chunk: int = 0,
        slack_cap: int | None = None,
    ) -> dict:
        """This step's batch: the largest one keeping the tightest running TPOT (Alg. 2), longer
        where the running requests' banked slack pays for it, and no longer than their slack
        allows (`_slack_chunks`)."""
        shape = budget(counts)
        shaped: dict = {}
        if shape.stable:  # else the tightest TPOT is already lost: throttling prefill saves nothing
            chunk = max(int(shape.prefill_budget), banked_chunk)
            if slack_cap is not None:
                chunk = min(chunk, slack_cap)
            shaped["chunk_size"] = max(1, min(view.chunk_size, chunk))
        if any(counts[:-1]):
            # the most decoders of today's average context that keep the batch time
            decoders = sum(counts)
            most = self.perf.max_batch_within(
                budget.tpot_shape(counts).batch_time + EPS,
                kv / decoders,
                spec_tokens_per_req=shape.spec_steps,
                limit=1 << 16,
            )
            if most > 0:
                shaped["batch_cap"] = min(view.max_running_requests, most)
        if self.alpha is not None:
            shaped["spec_steps"] = shape.spec_steps
        return shaped
