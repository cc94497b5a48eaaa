"""SLOs-Serve: soft admission by the multi-SLO DP every step, dynamic batch size, and
SLO-adaptive speculation length.

Admitted waiting requests go first in prefill-deadline order and stay admitted (forced) on
later steps while they wait; declined ones go to the best-effort tier (StepPlan.best_effort),
which runs on leftover budget and is reconsidered every step. Only the `max_candidates`
most urgent undecided requests enter the DP each step (the paper's 0–10 new requests per
invocation), so a deep queue costs one linear scan, not a bigger DP.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from scheduler.core.estimates import DEFAULT_OUTPUT_LEN
from scheduler.core.perf_model import default_model
from scheduler.core.slos_serve.batch_formation import EPS
from scheduler.core.slos_serve.dp import DpItem, TierBudget, admit
from scheduler.core.slos_serve.items import MIN_DERIVED_TPOT_S, Demand, demand, prefill_deadline
from scheduler.core.slos_serve.spec_length import Tier, optimize_spec_lengths
from scheduler.core.types import EngineView, PerfModel, RequestView, StepPlan


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

    def _demand(self, r: RequestView, now: float) -> Demand | None:
        return demand(r, now, self.default_output, self.prefill_share, self._floor)

    def plan(self, view: EngineView) -> StepPlan:
        now = view.now
        kv = max(0, view.total_kv_tokens - view.free_kv_tokens)
        # The fastest batch there is (one decoder of average context): a deadline needing
        # faster decoding than this is already lost and must not set everyone's batch time.
        kv_per = kv // max(1, len(view.running))
        self._floor = max(MIN_DERIVED_TPOT_S, self.perf.step_time(0, 1, kv_per))
        decoding: list[float | None] = []
        prefilling: list[tuple[RequestView, Demand]] = []
        for r in view.running:
            d = self._demand(r, now)
            if r.started or d is None:
                decoding.append(None if d is None else d.tpot)
            else:
                prefilling.append((r, d))

        undecided: list[tuple[float, str]] = []
        forced: list[tuple[RequestView, Demand]] = []
        declined: list[str] = []
        no_target: list[tuple[float, str]] = []
        by_rid: dict[str, RequestView] = {}
        for r in view.waiting:  # one cheap pass: only the deadline, full demands come later
            deadline = prefill_deadline(r, now, self.prefill_share)
            if deadline is None:
                no_target.append((r.arrival, r.rid))
            elif deadline <= now:
                declined.append(r.rid)
            elif r.rid in self._admitted and (admitted_demand := self._demand(r, now)) is not None:
                forced.append((r, admitted_demand))
            else:
                by_rid[r.rid] = r
                undecided.append((deadline, r.rid))
        candidates = heapq.nsmallest(self.max_candidates, undecided)
        demands = {rid: self._demand(by_rid[rid], now) for _, rid in candidates}

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
            item(rid, d, by_rid[rid].slo.weight, False, d.mem_tokens) for rid, d in demands.items() if d is not None
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

        taken = set(admitted) | {rid for _, rid in candidates}
        rest = sorted(x for x in undecided if x[1] not in taken)
        order = admitted + [rid for _, rid in rest] + [rid for _, rid in sorted(no_target)] + declined
        return StepPlan(order=order, best_effort=set(declined), **self._batch_knobs(budget, tuple(counts), view, kv))

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
