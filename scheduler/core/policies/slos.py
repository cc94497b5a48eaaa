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
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from scheduler.core.columns import SloTable, ViewColumns, columns_of
from scheduler.core.estimates import COMPOUND, DEADLINE, DEFAULT_OUTPUT_LEN, LATENCY
from scheduler.core.perf_model import default_model
from scheduler.core.slos_serve.batch_formation import EPS
from scheduler.core.slos_serve.dp import DpItem, TierBudget, admit
from scheduler.core.slos_serve.items import MIN_DERIVED_TPOT_S, Demand, demand, derived_tiers, expected_outputs
from scheduler.core.slos_serve.spec_length import Tier, optimize_spec_lengths
from scheduler.core.types import EngineView, PerfModel, RequestView, StepPlan


def _by_key(key: np.ndarray, rids: list[str], idx: np.ndarray) -> list[str]:
    """The rids at `idx` sorted as `sorted(zip(key, rid))` sorts them: by key, ties by rid."""
    order = idx[np.argsort(key[idx], kind="stable")]
    ranked = key[order]
    if ranked.size > 1 and np.any(ranked[1:] == ranked[:-1]):
        return [rid for _, rid in sorted(zip(key[idx].tolist(), (rids[i] for i in idx.tolist())))]
    return [rids[i] for i in order.tolist()]


def _waiting_positions(position: dict[str, int], rids: list[str]) -> np.ndarray | None:
    """The waiting positions of `rids` (None if one is not waiting)."""
    at = np.fromiter(map(position.get, rids, repeat(-1)), dtype=np.int64, count=len(rids))
    return at if not rids or at.min() >= 0 else None


@dataclass
class _Queue:
    """The waiting queue as one step's admission sees it."""

    undecided: list[str]  # by prefill deadline, ties by rid
    no_target: list[str]  # no prefill deadline: by arrival, ties by rid
    declined: list[str]  # prefill deadline already past, in queue order
    forced: list[tuple[RequestView, Demand]]  # admitted earlier and still waiting, in queue order
    waiting: Sequence[RequestView]
    position: dict[str, int]  # undecided rid -> its place in `waiting` (every waiting rid if unique)
    unique: bool  # no rid is queued twice

    def view(self, rid: str) -> RequestView:
        return self.waiting[self.position[rid]]


@dataclass(frozen=True)
class SlosServeParams:
    acceptance_rate: float | None = None  # speculation's per-token acceptance; None: no speculation
    max_candidates: int = 16  # undecided requests entering the DP per step
    max_spec_steps: int = 8
    default_output_tokens: int = DEFAULT_OUTPUT_LEN
    deadline_prefill_share: float = 0.2
    idle_batch_s: float = 0.05


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
        self._admitted: set[str] = set()  # admitted earlier, still waiting: forced
        self._floor = MIN_DERIVED_TPOT_S
        self._spec_memo: dict[tuple, int] = {}  # draft length per decoder mix (changes slowly)
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    def _demand(self, r: RequestView, now: float) -> Demand | None:
        return demand(r, now, self.default_output, self.prefill_share, self._floor)

    def plan(self, view: EngineView) -> StepPlan:
        now = view.now
        kv = max(0, view.total_kv_tokens - view.free_kv_tokens)
        # The fastest batch there is (one decoder of average context): a deadline needing
        # faster decoding than this is already lost and must not set everyone's batch time.
        kv_per = kv // max(1, len(view.running))
        self._floor = max(MIN_DERIVED_TPOT_S, self.perf.step_time(0, 1, kv_per))
        c = columns_of(view, self._slos)
        decoding, prefilling = self._running_demands(view, c)
        queue = self._triage(view, c)
        candidates = queue.undecided[: max(0, self.max_candidates)]
        demands = {rid: self._demand(queue.view(rid), now) for rid in candidates}
        forced = queue.forced
        declined = queue.declined

        tiers = sorted(
            {t for t in decoding if t is not None}
            | {d.tpot for _, d in prefilling + forced if d.tpot is not None}
            | {d.tpot for d in demands.values() if d is not None and d.tpot is not None}
        )
        index = {t: i for i, t in enumerate(tiers)}
        counts = [0] * (len(tiers) + 1)
        for t in decoding:
            counts[index[t] if t is not None else -1] += 1

        def item(rid: str, d: Demand, value: float, forced_item: bool, mem: int) -> DpItem:
            tier = index[d.tpot] if d.tpot is not None else -1
            return DpItem(rid, d.deadline, d.prefill_tokens, mem, tier, value, forced_item)

        # Running prefills already hold their memory; admitted-but-waiting ones do not yet.
        items = [item(r.rid, d, r.slo.weight, True, 0) for r, d in prefilling]
        items += [item(r.rid, d, r.slo.weight, True, d.mem_tokens) for r, d in forced]
        items += [
            item(rid, d, queue.view(rid).slo.weight, False, d.mem_tokens) for rid, d in demands.items() if d is not None
        ]

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
        budget = TierBudget(self.perf, tiers, kv, view.chunk_size, self.idle, self.alpha, self.max_spec, spec)
        # Admissions the engine could not start on time make the forced set infeasible: then the
        # most urgent items are decided again and the rest wait in the best-effort tier.
        result = admit(
            items,
            budget,
            tuple(counts),
            now,
            view.free_kv_tokens,
            view.max_running_requests,
            fallback_items=len(prefilling) + self.max_candidates,
        )
        running_ids = {r.rid for r, _ in prefilling}
        admitted = [rid for rid in result.admitted if rid not in running_ids]
        self._admitted = set(admitted)
        declined += [rid for rid in result.declined if rid not in running_ids]

        taken = set(admitted) | set(candidates)
        rest = [rid for rid in queue.undecided[len(candidates) :] if rid not in taken]
        order = admitted + rest + queue.no_target + declined
        plan = StepPlan(order=order, best_effort=set(declined), **self._batch_knobs(budget, tuple(counts), view, kv))
        if queue.unique:  # hand the engine the positions too: it applies them without rid lookups
            plan.order_at = _waiting_positions(queue.position, order)
            plan.best_effort_at = _waiting_positions(queue.position, declined)
        return plan

    def _running_demands(
        self, view: EngineView, c: ViewColumns
    ) -> tuple[list[float | None], list[tuple[RequestView, Demand]]]:
        """(each decoder's TPOT tier, None for none; the running requests still prefilling with
        their demands): `demand`'s tiers, read off the columns where they are the SLO's own."""
        now, nw = view.now, c.n_waiting
        run = slice(nw, None)
        cls, started, be_tier = c.cls[run], c.started[run], c.be_tier[run]
        decoders = started & ~be_tier  # declined and running: decodes without a target
        latency = decoders & (cls == LATENCY) & ~np.isnan(c.ttft_ms[run] + c.tpot_ms[run])
        left = c.deadline[run] - now  # nan: no deadline
        # A deadline with time left decodes at its remaining time per remaining token.
        paced = decoders & ((cls == DEADLINE) | (cls == COMPOUND)) & (left > 0)
        decoding: list[float | None] = (c.tpot_ms[run][latency] / 1000.0).tolist()
        decoding += [None] * int(np.count_nonzero(started & ~latency & ~paced))
        if paced.any():
            rows = nw + np.flatnonzero(paced)
            out = expected_outputs(c.predicted[rows], c.max_new[rows], c.generated[rows], self.default_output)
            decoding += derived_tiers(left[paced] / out, self._floor)
        prefilling: list[tuple[RequestView, Demand]] = []
        for i in np.flatnonzero(~started).tolist():
            r = view.running[i]
            if (d := self._demand(r, now)) is None:
                decoding.append(None)
            else:
                prefilling.append((r, d))
        return decoding, prefilling

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
        rids = c.rids[:nw]
        position = dict(zip(rids, range(nw)))
        unique = len(position) == nw
        open_ = due > now
        forced: list[tuple[RequestView, Demand]] = []
        if self._admitted:
            if unique:
                again = sorted(i for rid in self._admitted if (i := position.get(rid)) is not None)
            else:
                again = [i for i, rid in enumerate(rids) if rid in self._admitted]
            for i in again:
                if open_[i] and (d := self._demand(view.waiting[i], now)) is not None:
                    forced.append((view.waiting[i], d))
                    open_[i] = False
        undecided = np.flatnonzero(open_)
        if not unique:  # a rid queued twice: the view of its last undecided entry, as a dict keeps
            position = {rids[i]: i for i in undecided.tolist()}
        return _Queue(
            undecided=_by_key(due, rids, undecided),
            no_target=_by_key(c.arrival, rids, np.flatnonzero(np.isnan(due))),
            declined=[rids[i] for i in np.flatnonzero(due <= now).tolist()],
            forced=forced,
            waiting=view.waiting,
            position=position,
            unique=unique,
        )

    def _batch_knobs(self, budget: TierBudget, counts: tuple[int, ...], view: EngineView, kv: int) -> dict:
        """This step's batch: the largest one keeping the tightest running TPOT (Alg. 2)."""
        shape = budget(counts)
        knobs: dict = {}
        if shape.stable:  # else the tightest TPOT is already lost: throttling prefill saves nothing
            knobs["chunk_size"] = max(1, min(view.chunk_size, int(shape.prefill_budget)))
        if any(counts[:-1]):
            # the most decoders of today's average context that keep the batch time
            decoders = sum(counts)
            most = self.perf.max_batch_within(
                shape.batch_time + EPS, kv / decoders, spec_tokens_per_req=shape.spec_steps, limit=1 << 16
            )
            if most > 0:
                knobs["batch_cap"] = min(view.max_running_requests, most)
        if self.alpha is not None:
            knobs["spec_steps"] = shape.spec_steps
        return knobs
