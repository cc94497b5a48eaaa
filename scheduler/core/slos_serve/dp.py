"""Multi-SLO dynamic programme for soft admission (SLOs-Serve §3.2.1, App. C form).

Requests are taken in prefill-deadline order. A state after admitting request i is the
number of admitted decoders per TPOT tier; for each state we keep the Pareto set of
(value, prefill budget left at pDDL_i, memory used). Moving from the last admitted j to i
adds the prefill budget of the batches that fit in pDDL_i − pDDL_j (the decoders of state j
set their time and size, Alg. 2) and pays p_i; budget must never go negative, so every
admitted prefill finishes by its deadline (EDF), and every state must be stable (its decodes
fit in the batch time), so every admitted TPOT holds. Decoding is deadline-based: a request's
token k is due at pDDL + k·TPOT, so its decode demand starts at its prefill deadline.
Forced items (running requests, earlier admissions) can never be skipped; soft_admission.py decides
which promises to keep when that has no solution.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.core.slos_serve.batch_formation import BatchShape, prefill_capacity
from scheduler.core.slos_serve.spec_length import Tier, acceptance, optimize_spec_lengths
from scheduler.core.types import PerfModel
from scheduler.core.work_budget import WorkBudget

EPS = 1e-9
# Work units (work_budget.py) of the DP's steps, in the ratio of their costs in this module's
# Python (fitted by benchmarks/experiments/decision_latency.py's dp_units_per_ms cases): one
# per Pareto entry compared and per predecessor looked at, INSERT_UNITS per entry extended,
# PAIR_UNITS per (predecessor state, item) pair, SHAPE_UNITS per batch shape computed.
PAIR_UNITS = 17
INSERT_UNITS = 7
SHAPE_UNITS = 180
Counts = tuple[int, ...]  # decoders per tier, tightest first; the last slot has no TPOT target


@dataclass(frozen=True)
class DpItem:
    rid: str
    deadline: float  # absolute prefill deadline pDDL (first token due)
    prefill_tokens: int
    mem_tokens: int = 0
    tier: int = -1  # index into the tier TPOTs; -1: decodes with no TPOT target
    value: float = 1.0
    forced: bool = False
    started: bool = False  # its prefill runs already: past its deadline, its tokens are still owed


@dataclass
class DpResult:
    admitted: list[str]  # in prefill-deadline order
    declined: list[str]
    value: float
    slack_tokens: float  # prefill budget left at the last admitted deadline
    counts: Counts  # final decoders per tier (collapsed to the tightest one by TierBudget.canonical)
    forced_ok: bool = True  # False: the forced items were infeasible; those that did not fit were declined
    admitted_items: list[DpItem] = field(default_factory=list)
    exhausted: bool = False  # True: the work budget ran out; the forced items kept greedily, no others
    credit_used: bool = False  # the admitted set needs the first batch's extra prefill (soft_admission)


class TierBudget:
    """Batch time and per-batch prefill budget for a given set of decoders per tier
    (the partial-batch solver PB* of Eqn. 3, Alg. 2 or, with α, §3.2.3); memoised.
    With α and a fixed `spec_steps`, batch time is the tightest TPOT × Acc(spec_steps)."""

    def __init__(
        self,
        perf: PerfModel,
        tier_tpots: Sequence[float],
        kv_tokens: int = 0,
        chunk_cap: int | None = None,
        idle_batch_s: float = 0.05,
        alpha: float | None = None,
        max_spec: int = 8,
        spec_steps: int | None = None,
    ) -> None:
        self.perf = perf
        self.tiers = list(tier_tpots)
        self.kv = kv_tokens
        self.cap = chunk_cap
        self.idle = idle_batch_s
        self.alpha = alpha
        self.max_spec = max_spec
        self.spec_steps = spec_steps  # fixed length (chosen once per step); None: optimise per state
        self._memo: dict[Counts, BatchShape] = {}
        self.shapes = 0  # shapes computed (memo misses): each costs a bisection of the perf model

    def canonical(self, counts: Counts) -> Counts:
        """The shape depends only on the tightest active tier and the number of decoders
        (each takes the same tokens per batch), so all decoders move into that tier: an
        exact collapse of the paper's per-tier state that keeps the DP small."""
        total = sum(counts)
        out = [0] * len(counts)
        out[next((i for i, n in enumerate(counts[:-1]) if n > 0), len(counts) - 1)] = total
        return tuple(out)

    def __call__(self, counts: Counts) -> BatchShape:
        shape = self._memo.get(counts)
        if shape is None:
            shape = self._memo[counts] = self._shape(counts)
            self.shapes += 1
        return shape

    def _shape(self, counts: Counts) -> BatchShape:
        decoders = sum(counts)
        t0 = next((t for t, n in zip(self.tiers, counts[:-1], strict=True) if n > 0), None)
        if t0 is None:  # no TPOT to keep: full chunks, or idle-length batches when those are shorter
            if self.cap is not None:
                full = BatchShape(self.perf.step_time(self.cap, decoders, self.kv), decoders, float(self.cap))
                if full.batch_time <= self.idle:
                    return full
                # A full chunk outlasting a short prefill deadline would count as no budget at
                # all (only whole batches fit an interval): plan in idle-length slices instead.
                short = min(prefill_capacity(self.perf, self.idle, decoders, self.kv), float(self.cap))
                return BatchShape(self.idle, decoders, short) if short >= 1 else full
            t0 = self.idle
        steps = 0
        batch_time = t0
        if self.alpha is not None and decoders and self.spec_steps is not None:
            steps, batch_time = self.spec_steps, t0 * acceptance(self.spec_steps, self.alpha)
        elif self.alpha is not None and decoders:
            tiers = [Tier(t, n) for t, n in zip(self.tiers, counts[:-1], strict=True)] + [Tier(math.inf, counts[-1])]
            choice = optimize_spec_lengths(self.perf, tiers, self.alpha, self.kv, self.max_spec, self.cap, uniform=True)
            if choice is not None:
                steps, batch_time = choice.steps, choice.batch_time_s
        budget = prefill_capacity(self.perf, batch_time, decoders, self.kv, decoders * steps)
        if self.cap is not None:
            budget = min(budget, float(self.cap))
        return BatchShape(batch_time, decoders, budget, steps)


def interval_budget(shape: BatchShape, dt: float) -> float:
    """Prefill tokens the whole batches of this shape that fit in dt can carry."""
    if dt <= 0 or shape.batch_time <= 0:
        return 0.0
    return math.floor(dt / shape.batch_time + EPS) * shape.prefill_budget


# An entry: (value, prefill budget, memory, parent entry or None, item index or -1).
_Entry = tuple
_UNSEEN: Any = object()  # a successor not looked up yet


def _insert(front: list[_Entry], entry: _Entry) -> None:
    """Keep only Pareto-optimal entries: more value, more budget, less memory."""
    v, pb, mem = entry[0], entry[1], entry[2]
    for e in front:
        if e[0] >= v - EPS and e[1] >= pb - EPS and e[2] <= mem + EPS:
            return
    front[:] = [e for e in front if not (v >= e[0] - EPS and pb >= e[1] - EPS and mem <= e[2] + EPS)]
    front.append(entry)


def solve(
    items: Sequence[DpItem],
    budget: Callable[[Counts], BatchShape],
    base_counts: Counts,
    now: float,
    mem_budget: float,
    max_decoders: int | None,
    work: WorkBudget | None = None,
    debt: float = 0.0,
) -> DpResult | None:
    """The most valuable feasible set keeping every forced item, or None when there is none.
    `debt`: prefill tokens the first batches owe before any item's (prompts already lost)."""
    order = sorted(range(len(items)), key=lambda k: (items[k].deadline, not items[k].forced))
    seq = [items[k] for k in order]
    times = [now] + [it.deadline for it in seq]
    canon: Callable[[Counts], Counts] = getattr(budget, "canonical", lambda c: c)
    base_counts = canon(base_counts)
    # states[s]: counts -> Pareto front, s = 0 before any admission, s = i + 1 after seq[i].
    states: list[dict[Counts, list[_Entry]]] = [dict() for _ in range(len(seq) + 1)]
    base_ok = budget(base_counts).stable
    if base_ok:
        states[0][base_counts] = [(0.0, -debt, 0.0, None, -1)]
    lo = 0  # states before the last forced item may not be predecessors
    slot_of = len(base_counts) - 1
    spend = work.spend if work is not None else None
    shapes = getattr(budget, "shapes", None)  # a TierBudget counts the shapes it computed
    charged = shapes if shapes is not None else 0
    # Per solve, what every (state, item) pair would otherwise recompute: a state's successor
    # in a tier (None: too many decoders or unstable), its batch shape, and a finished
    # state's most budget left (its front no longer changes once later items are placed).
    succ: dict[tuple[Counts, int], Counts | None] = {}
    shape_of: dict[Counts, BatchShape] = {}
    tops: list[dict[Counts, float] | None] = [None] * (len(seq) + 1)
    for i, it in enumerate(seq):
        s = i + 1
        if it.deadline > now:
            slot = it.tier if it.tier >= 0 else slot_of
            here = states[s]
            if spend is not None:  # the predecessors looked at, states or none
                spend(s - lo)
            for j in range(lo, s):
                there = states[j]
                if not there:
                    continue
                top = tops[j]
                if top is None:
                    top = tops[j] = {key: max(e[1] for e in front) for key, front in there.items()}
                dt = times[s] - times[j]
                for key, front in there.items():
                    new_key = succ.get((key, slot), _UNSEEN)
                    if new_key is _UNSEEN:
                        new_key = canon(key[:slot] + (key[slot] + 1,) + key[slot + 1 :])
                        if (max_decoders is not None and sum(new_key) > max_decoders) or not budget(new_key).stable:
                            new_key = None
                        succ[(key, slot)] = new_key
                    if spend is not None:  # the entries extended, each compared with the target's
                        units = (
                            PAIR_UNITS
                            if new_key is None
                            else PAIR_UNITS + len(front) * (INSERT_UNITS + len(here.get(new_key, ())))
                        )
                        if shapes is not None:  # and the shapes computed since the last charge
                            shapes = budget.shapes  # type: ignore[attr-defined]
                            units += SHAPE_UNITS * (shapes - charged)
                            charged = shapes
                        spend(units)
                    if new_key is None:
                        continue
                    shape = shape_of.get(key)
                    if shape is None:
                        shape = shape_of[key] = budget(key)
                    gain = interval_budget(shape, dt) - it.prefill_tokens
                    if gain + top[key] < -EPS:
                        continue
                    target = here.setdefault(new_key, [])
                    for e in front:
                        pb = e[1] + gain
                        mem = e[2] + it.mem_tokens
                        if pb >= -EPS and mem <= mem_budget + EPS:
                            _insert(target, (e[0] + it.value, pb, mem, e, i))
                    if not target:
                        del here[new_key]
        if it.forced:
            lo = s
    best: _Entry | None = None
    best_key: Counts = base_counts
    for s in range(lo, len(seq) + 1):
        for key, front in states[s].items():
            for e in front:
                if best is None or (e[0], e[1], -e[2]) > (best[0], best[1], -best[2]):
                    best, best_key = e, key
    if best is None:
        if not base_ok and not any(it.forced for it in seq):
            return DpResult([], [it.rid for it in seq], 0.0, 0.0, base_counts)
        return None
    chosen: list[DpItem] = []
    e = best
    while e is not None and e[4] >= 0:
        chosen.append(seq[e[4]])
        e = e[3]
    chosen.reverse()
    taken = {c.rid for c in chosen}
    return DpResult(
        admitted=[c.rid for c in chosen],
        declined=[it.rid for it in seq if it.rid not in taken],
        value=best[0],
        slack_tokens=best[1],
        counts=best_key,
        admitted_items=chosen,
    )
