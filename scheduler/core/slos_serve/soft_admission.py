"""Soft admission around the multi-SLO DP: broken promises, the re-decision when the earlier
promises no longer fit together, and the plan when the search's budget runs out.

The DP (dp.py) keeps every forced item (a running prompt, an earlier admission still waiting)
or finds no plan. Forced sets stop being feasible in two ways the paper's invariant leaves out:
a prompt whose first token is already late, and admissions the engine could not start in time.
Then the most urgent items are decided again as equals. Solving them again with the DP costs
the square of their number (free items do not pin the DP's predecessors): milliseconds a pass
on a deep, overloaded queue. Moore-Hodgson's rule (earliest deadline first; when the prefix
overflows, give up its largest prompt per unit of value) keeps most of them in n log n, checked
by one walk under the DP's own rules.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scheduler.core.slos_serve.batch_formation import BatchShape
from scheduler.core.slos_serve.dp import EPS, PAIR_UNITS, SHAPE_UNITS, Counts, DpItem, DpResult, interval_budget, solve
from scheduler.core.work_budget import BudgetExhausted, WorkBudget


def admit(
    items: Sequence[DpItem],
    budget: Callable[[Counts], BatchShape],
    base_counts: Counts,
    now: float,
    mem_budget: float = math.inf,
    max_decoders: int | None = None,
    fallback_items: int | None = None,
    work: WorkBudget | None = None,
    credit: float = 0.0,
) -> DpResult:
    """Choose the most valuable set of items whose prefill deadlines, TPOTs, memory and batch
    size all hold under the model, the forced ones included where they still can.

    A forced item already past its prefill deadline is lost: declined, and when its prefill
    has started (it runs whatever we decide) its tokens are a debt the first batches pay and it
    decodes after without a target. When the other forced items cannot all be kept, the
    `fallback_items` most urgent items (None: all), forced or not, are decided again by
    `most_that_fit` and the rest declined (forced_ok=False). `work` bounds the whole search;
    once it runs out the result is `kept_promises` (exhausted=True). `credit`: prefill tokens
    this step's batch may carry beyond its shape's budget (the running requests' banked
    slack); `credit_used` says whether the admitted set needs them."""
    lost = [it for it in items if it.forced and it.deadline <= now]
    live = [it for it in items if not (it.forced and it.deadline <= now)]
    started = sum(1 for it in lost if it.started)
    debt = float(sum(it.prefill_tokens for it in lost if it.started)) - credit
    if started:
        base_counts = base_counts[:-1] + (base_counts[-1] + started,)
    try:
        result = solve(live, budget, base_counts, now, mem_budget, max_decoders, work, debt)
        if result is None:
            urgent = sorted(live, key=lambda it: it.deadline)
            limit = len(urgent) if fallback_items is None else max(0, fallback_items)
            walk = _Walk(budget, now, mem_budget, max_decoders, work)
            result = most_that_fit(urgent[:limit], walk, base_counts, debt)
            result.declined += [it.rid for it in urgent[limit:]]
    except BudgetExhausted:
        result = kept_promises(live, now)
    if credit > 0 and not result.exhausted:
        result.credit_used = not _fits(
            result.admitted_items, _Walk(budget, now, mem_budget, max_decoders, None), base_counts, debt + credit
        )
    result.declined += [it.rid for it in lost]
    return result


def _fits(items: Sequence[DpItem], walk: _Walk, counts: Counts, debt: float) -> bool:
    """Whether these items, in prefill-deadline order, all fit one path of the DP."""
    state = walk.start(counts, debt)
    for it in items:
        if state is None:
            return False
        state = walk.extend(state, it)
    return state is not None


def kept_promises(items: Sequence[DpItem], now: float) -> DpResult:
    """The plan when the search's budget runs out: the earlier promises (forced items) kept as
    they stand, in prefill-deadline order, and no new item admitted (they wait in the
    best-effort tier and are decided again next pass). Whether the promises still fit was
    the question the budget could not afford; the engine's batch cap and memory still bound
    what starts. One sort of the items: no batch shape is computed."""
    ordered = sorted(items, key=lambda it: (it.deadline, not it.forced))
    chosen = [it for it in ordered if it.forced and it.deadline > now]
    return DpResult(
        admitted=[c.rid for c in chosen],
        declined=[it.rid for it in ordered if not (it.forced and it.deadline > now)],
        value=sum(c.value for c in chosen),
        slack_tokens=0.0,
        counts=(),
        admitted_items=chosen,
        exhausted=True,
    )


def most_that_fit(items: Sequence[DpItem], walk: _Walk, counts: Counts, debt: float) -> DpResult:
    """Items in deadline order (forced or not, all decided again): Moore-Hodgson against the
    first batch's shape, whose budget shrinks as decoders join (so it errs toward keeping),
    then one walk with each state's own shape that declines what still does not fit."""
    start = walk.start(counts, debt)
    if start is None:  # the running decodes alone overrun their TPOT: nothing can be kept
        return DpResult([], [it.rid for it in items], 0.0, 0.0, counts, forced_ok=False)
    first = walk.budget(start.counts)
    heap: list[tuple[float, int]] = []  # (-prompt tokens per unit of value, -position): largest first
    demand = debt
    for k, it in enumerate(items):
        if walk.work is not None:
            walk.work.spend(PAIR_UNITS)
        heapq.heappush(heap, (-it.prefill_tokens / max(it.value, EPS), -k))
        demand += it.prefill_tokens
        while heap and demand > interval_budget(first, it.deadline - walk.now) + EPS:
            demand -= items[-heapq.heappop(heap)[1]].prefill_tokens
    state, chosen = start, []
    for k in sorted(-k for _, k in heap):
        if (nxt := walk.extend(state, items[k])) is not None:
            state = nxt
            chosen.append(items[k])
    taken = {it.rid for it in chosen}
    return DpResult(
        admitted=[it.rid for it in chosen],
        declined=[it.rid for it in items if it.rid not in taken],
        value=sum(it.value for it in chosen),
        slack_tokens=state.budget,
        counts=state.counts,
        forced_ok=False,
        admitted_items=chosen,
    )


@dataclass(frozen=True)
class _State:
    counts: Counts
    time: float  # the last kept item's prefill deadline (now before any)
    budget: float  # prefill tokens left at that time
    mem: float


class _Walk:
    """One path of the DP: items kept one after another, each checked by the DP's own rules
    (a stable successor within the decoder limit, whole batches of the predecessor's shape in
    the interval, budget never negative, memory), charged to the same work budget."""

    def __init__(
        self,
        budget: Callable[[Counts], BatchShape],
        now: float,
        mem_budget: float,
        max_decoders: int | None,
        work: WorkBudget | None,
    ) -> None:
        self.budget = budget
        self.canon: Callable[[Counts], Counts] = getattr(budget, "canonical", lambda c: c)
        self.now = now
        self.mem_budget = mem_budget
        self.max_decoders = max_decoders
        self.work = work
        self._shapes: int | None = getattr(budget, "shapes", None)  # a TierBudget counts its shapes

    def start(self, counts: Counts, debt: float) -> _State | None:
        counts = self.canon(counts)
        return _State(counts, self.now, -debt, 0.0) if self._shape(counts).stable else None

    def extend(self, state: _State, it: DpItem) -> _State | None:
        slot = it.tier if it.tier >= 0 else len(state.counts) - 1
        key = self.canon(state.counts[:slot] + (state.counts[slot] + 1,) + state.counts[slot + 1 :])
        if (self.max_decoders is not None and sum(key) > self.max_decoders) or not self._shape(key).stable:
            return None
        left = state.budget + interval_budget(self._shape(state.counts), it.deadline - state.time) - it.prefill_tokens
        mem = state.mem + it.mem_tokens
        if left < -EPS or mem > self.mem_budget + EPS:
            return None
        return _State(key, it.deadline, left, mem)

    def _shape(self, counts: Counts) -> BatchShape:
        shape = self.budget(counts)
        if self.work is not None:
            units = PAIR_UNITS
            if self._shapes is not None:  # and the shapes computed since the last charge
                shapes = self.budget.shapes  # type: ignore[attr-defined]
                units += SHAPE_UNITS * (shapes - self._shapes)
                self._shapes = shapes
            self.work.spend(units)
        return shape
