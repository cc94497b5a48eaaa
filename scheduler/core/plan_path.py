"""The one plan path: what every policy's plan becomes before any engine applies it.

A policy decides what it cares about (order, admission, its own cap or chunk, preemptions); the rest of
a step's decision is the same for every policy and lives here, so the SGLang adapter and the
simulator apply exactly the same plan and differ only in the engine underneath:

- `max_queue_ms` expiries are dropped with `slo_queue_timeout`, and requests that ask to be
  rejected when their SLO is out of reach (`on_infeasible: reject`) with `slo_infeasible` once
  the admission check says they will certainly miss it, under every policy (both are the
  request's own admission terms, not a policy's choice); each drop carries its predicted wait,
  what its Retry-After is computed from;
- the batch cap, prefill chunk and prefill gate a plan leaves open come from the performance
  model (`batch_levers`: SLOs-Serve Alg. 2, PolyServe §3.4/§4.7 with the DSLO's banked slack;
  a PD decode worker's cap from `decode_admission`, deadline-based), when one is trusted, in
  both batching modes, then capped by the policy's own per-step token budget if it has one
  (`chunk_cap`);
- under the SLO levers, best-effort-tier requests already past due are held while SLO work is
  in the engine, and running ones whose SLO is lost are retracted where the batch cap leaves
  that work no room (`lost_hold`: the tier runs on what the SLO requests leave, SLOs-Serve §4.1);
- when several tenants (API keys) have work waiting, the policy's order is blended with their
  fair-share order (`fairness.FairShare`, Tempo/JITServe §4.3), before any of the above reads
  it; stock fcfs and PD decode workers keep their order;
- guards keep a plan applicable: drops and tiers name waiting requests, preemptions running
  ones, the cap admits at least one request and the chunk stays within the start-up size.

`finalize_plan` is pure and data-only in and out, so a plan can be recorded, compared and sent
to other ranks as it is. `plan_pass` is one pass: the policy's plan and its finishing read the
requests' columns once between them (scheduler/core/columns.py).
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

import numpy as np

from scheduler.core.admission import SLO_INFEASIBLE_REASON, backlog, certainly_late
from scheduler.core.batch_limits import batch_levers, prefill_alone, step_ratio_chunk
from scheduler.core.columns import RowCache, ViewColumns
from scheduler.core.decode_admission import decode_cap
from scheduler.core.estimates import BEST_EFFORT
from scheduler.core.fairness import DEFAULT_TENANT_FAIRNESS, FairShare
from scheduler.core.lost_hold import held_lost_at, held_lost_causes, yielding_lost
from scheduler.core.pass_columns import columns_of, columns_read, sharing
from scheduler.core.position_rids import PositionRids
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON, expired_in_queue, expired_rids
from scheduler.core.types import EngineView, PerfModel, Policy, StepPlan

MIXED, PREFILL, DECODE = "mixed", "prefill", "decode"  # an engine's role (PD workers: prefill/decode)


@dataclass(frozen=True)
class PlanSettings:
    """What the engine is, as far as finishing a plan goes."""

    apply_levers: bool = True  # apply any lever at all, the plan's or sized (False: stock SGLang, e.g. fcfs)
    levers: bool = True  # size the cap, chunk and prefill gate a plan leaves open from the perf model
    mixed_batching: bool = True  # prefill chunks ride with decodes: the chunk lever applies
    role: str = MIXED  # PD prefill workers chunk dynamically; PD decode workers never drop or preempt
    # The most prompt tokens one step prefills under the levers (None: the start-up chunk): a
    # policy's own per-step token budget, over whatever the perf model sizes (gmax.py).
    chunk_cap: int | None = None
    # The same budget stated as a step time: the chunk whose mixed step takes at most this many
    # plain decode steps (batch_limits.step_ratio_chunk; None: none).
    chunk_step_ratio: float | None = None
    # Let a step whose prefill starts a first token run without the decodes where their slack
    # allows (batch_limits.prefill_alone); under the levers and mixed batching, for a policy
    # that asks (the `prefill_alone` parameter of slos and tempo, on by default, and gmax).
    prefill_alone: bool = False
    # f of the fair-share blend between tenants (scheduler/core/fairness.py; 0: the policy's
    # order alone). Nothing changes while fewer than two tenants (API keys) have work waiting.
    tenant_fairness: float = DEFAULT_TENANT_FAIRNESS


def settings_for(
    policy: Policy, mixed_batching: bool = True, role: str = MIXED, tenant_fairness: float = DEFAULT_TENANT_FAIRNESS
) -> PlanSettings:
    """How an engine finishes `policy`'s plans: fcfs is stock SGLang (nothing applied); an
    ordering baseline's own cap and chunk apply but the engine's SLO levers do not (as in the papers'
    baselines, which reorder a stock engine); an SLO policy gets both."""
    stock = policy.name == "fcfs"
    levers = not stock and policy.slo_levers
    return PlanSettings(
        apply_levers=not stock,
        levers=levers,
        mixed_batching=mixed_batching,
        role=role,
        chunk_cap=getattr(policy, "chunk_cap", None) if levers else None,  # optional: few policies set one
        chunk_step_ratio=getattr(policy, "chunk_step_ratio", None) if levers else None,
        prefill_alone=levers and mixed_batching and getattr(policy, "prefill_alone", False),
        tenant_fairness=tenant_fairness,
    )


@dataclass(frozen=True)
class LeverModel:
    """The model the levers a plan leaves open are sized with: the engine's perf model, or its speculative
    cost at the current drafting length, where a batch may last `tokens_per_step` TPOTs."""

    perf: PerfModel
    tokens_per_step: float = 1.0


@dataclass(frozen=True)
class FinalPlan:
    """A finished plan: the engine applies it verbatim. A None lever leaves the engine's own."""

    order: tuple[str, ...] | None = None  # waiting rids, most urgent first; unlisted ones after (others ignored)
    best_effort: AbstractSet[str] = frozenset()  # waiting rids in the best-effort tier (run last)
    hold: AbstractSet[str] = frozenset()  # best-effort-tier rids not started this pass (lost_hold)
    drop: dict[str, str] = field(default_factory=dict)  # waiting rid -> reason
    waits: dict[str, float] = field(default_factory=dict)  # dropped rid -> predicted seconds until it would start
    preempt: tuple[str, ...] = ()  # running rids to retract this pass
    batch_cap: int | None = None  # running-batch cap for this pass
    chunk_size: int | None = None  # prefill token budget for this pass (None: the start-up size)
    prefill: bool = True  # False: no prefill this pass (none started, none continued): decodes only
    prefill_alone: bool = False  # True: this pass's prefill runs without the decodes (they wait it out)
    # `order` and `best_effort` as positions in the planned view's waiting list, when the policy
    # gave them and nothing was dropped (StepPlan.order_at): for the engine that made the view
    order_at: np.ndarray | None = field(default=None, compare=False)
    best_effort_at: np.ndarray | None = field(default=None, compare=False)
    hold_at: np.ndarray | None = field(default=None, compare=False)  # `hold` as positions (ascending)
    # with `best_effort_at`: the positions whose tier this plan changes, of the requests with an
    # SLO (their views say their tier), and the positions of those of class best effort (their
    # views are in the tier either way): what RequestStates.mark_tier_at reads
    tier_flips_at: np.ndarray | None = field(default=None, compare=False)
    best_effort_class_at: np.ndarray | None = field(default=None, compare=False)

    def tier_size(self) -> int:
        """How many waiting requests are in the best-effort tier, without building its set."""
        return len(self.best_effort_at) if self.best_effort_at is not None else len(self.best_effort)

    def held_size(self) -> int:
        """How many of them this pass holds, likewise."""
        return len(self.hold_at) if self.hold_at is not None else len(self.hold)


def finalize_plan(
    view: EngineView,
    plan: StepPlan,
    settings: PlanSettings,
    lever_model: LeverModel | None = None,
    wait_model: PerfModel | None = None,
) -> FinalPlan:
    """`plan` completed with what every policy gets; `lever_model` None: no trusted model yet.
    `wait_model` predicts the drops' waits (any estimate beats none there; default: the
    lever model's)."""
    c = columns_read(view)  # the policy's read of this pass, if it made one
    if c is None and view.known_rows is not None:
        c = columns_of(view)  # the engine keeps them current: cheaper than one walk of the views
    waiting: set[str] = set()  # the waiting rids, needed only to check the plan's own rids
    tier_at = plan.best_effort_at if plan.order_at is not None else None  # positions: all waiting
    if plan.drop or (plan.best_effort and tier_at is None):
        waiting = set(c.rids[: c.n_waiting]) if c is not None else {r.rid for r in view.waiting}
    drop: dict[str, str] = {}
    waits: dict[str, float] = {}
    if settings.role != DECODE:  # a PD decode request already holds transferred KV
        drop = {rid: reason for rid, reason in plan.drop.items() if rid in waiting}
        expired = expired_rids(c, view.now) if c is not None else expired_in_queue(view.waiting, view.now)
        for rid in expired:
            drop.setdefault(rid, QUEUE_TIMEOUT_REASON)
        trusted = None if lever_model is None else lever_model.perf
        for rid in certainly_late(view, trusted, plan.order, plan.best_effort, columns=c):
            drop.setdefault(rid, SLO_INFEASIBLE_REASON)
        model = wait_model if wait_model is not None else trusted
        if drop and model is not None:
            starts = backlog(view, model, plan.order, plan.best_effort).start_of(view)
            waits = {rid: starts[rid] for rid in drop}
    kept = waiting - drop.keys() if drop else waiting
    order = None
    if plan.order is not None:
        order = tuple(rid for rid in plan.order if rid not in drop) if drop else tuple(plan.order)
    preempt: tuple[str, ...] = ()
    if settings.role != DECODE and plan.preempt:
        running = set(c.rid_array[c.n_waiting :].tolist()) if c is not None else {r.rid for r in view.running}
        preempt = tuple(dict.fromkeys(plan.preempt))  # each once, in the plan's order
        if not running.issuperset(preempt):  # a policy may list every running request: one C check
            preempt = tuple(rid for rid in preempt if rid in running)
    if settings.levers and c is None:
        c = columns_of(view)  # the levers and the hold read most of them
    cap, chunk, prefill = _levers(view, plan, settings, lever_model, c)
    alone = False
    if prefill and settings.prefill_alone and settings.levers and settings.role == MIXED and lever_model is not None:
        if lever_model.tokens_per_step == 1.0:  # a speculative step's drafts are sized as mixed
            c = c if c is not None else columns_of(view)
            alone = prefill_alone(view, lever_model.perf, chunk if chunk is not None else view.chunk_size, c)
    best_effort: AbstractSet[str]
    if tier_at is not None and drop:  # the tier's rids are all waiting
        best_effort = frozenset(plan.best_effort - drop.keys())
    elif tier_at is not None:  # kept as the policy made it (PositionRids: no set built)
        tier = plan.best_effort
        best_effort = tier if isinstance(tier, (frozenset, PositionRids)) else frozenset(tier)
    else:
        best_effort = frozenset(plan.best_effort & kept) if plan.best_effort else frozenset()
    hold: AbstractSet[str] = frozenset()
    hold_at = flips_at = best_effort_class_at = None
    if tier_at is not None and not drop:
        if c is None:
            c = columns_of(view)
        flips_at, best_effort_class_at = _tier_flips(c, tier_at)
    if settings.levers and settings.role != DECODE:
        assert c is not None  # read above for the levers
        if tier_at is not None and not drop:
            hold_at = held_lost_at(view, tier_at, c)
            hold = PositionRids(c.rid_array, hold_at) if hold_at.size else frozenset()
        else:
            hold = held_lost_causes(view, best_effort, c)
    if settings.levers and settings.role == MIXED and cap is not None and c is not None:
        yielding = yielding_lost(view, cap, tier_at, best_effort, drop.keys(), preempt, c)
        preempt = (*preempt, *yielding) if yielding else preempt
    return FinalPlan(
        order=order,
        best_effort=best_effort,
        hold=hold,
        drop=drop,
        waits=waits,
        preempt=preempt,
        batch_cap=cap,
        chunk_size=chunk,
        prefill=prefill,
        prefill_alone=alone,
        order_at=None if drop else plan.order_at,
        best_effort_at=None if drop else tier_at,
        hold_at=hold_at,
        tier_flips_at=flips_at,
        best_effort_class_at=best_effort_class_at,
    )


def plan_pass(
    view: EngineView,
    policy: Policy,
    settings: PlanSettings,
    lever_model: LeverModel | None = None,
    wait_model: PerfModel | None = None,
    cache: RowCache | None = None,
    fair: FairShare | None = None,
) -> FinalPlan:
    """`policy`'s plan for `view`, finished: both read the view's columns once (`cache`: the
    engine's static per-request numbers across passes, under RowCache's contract). `fair`:
    the engine's tenant counters; the policy's order is blended with the tenants' fair order
    before it is finished, so admission and drops see the order the engine applies."""
    with sharing(view, cache):
        plan = policy.plan(view)
        if fair is not None and settings.apply_levers and settings.role != DECODE:
            plan = fair.blend(view, plan, settings.tenant_fairness)
        return finalize_plan(view, plan, settings, lever_model, wait_model)


def _levers(
    view: EngineView, plan: StepPlan, settings: PlanSettings, lever_model: LeverModel | None, c: ViewColumns | None
) -> tuple[int | None, int | None, bool]:
    """Batch cap, prefill chunk and prefill gate: the plan's own, else the perf model's, within
    the engine's limits."""
    if not settings.apply_levers or settings.role == PREFILL:
        # A PD prefill step shares nothing with decodes: TPOT-derived caps and chunks do not
        # apply (PolyServe §3.4); its budget is dynamic chunking's.
        return None, None, True
    cap, chunk, prefill = plan.batch_cap, plan.chunk_size, True
    if not settings.levers:
        lever_model = None
    if lever_model is not None and settings.role == MIXED and (cap is None or chunk is None):
        # (a plan that sets both has no use for the derived levers, the costlier part of a pass)
        derived = batch_levers(view, lever_model.perf, lever_model.tokens_per_step, settings.mixed_batching, c)
        cap = cap if cap is not None else derived.batch_cap
        if chunk is None:
            chunk, prefill = derived.chunk_size, derived.prefill
    elif lever_model is not None and cap is None:  # a PD decode worker: only its admission cap applies
        cap = decode_cap(view, lever_model.perf, lever_model.tokens_per_step, c)
    if settings.chunk_cap and settings.role == MIXED:
        chunk = min(chunk if chunk is not None else view.chunk_size, settings.chunk_cap)
    if settings.chunk_step_ratio and settings.role == MIXED and lever_model is not None and view.chunk_size > 0:
        budget = step_ratio_chunk(view, lever_model.perf, settings.chunk_step_ratio, c)
        chunk = min(chunk if chunk is not None else view.chunk_size, budget)
    if cap is not None:
        cap = max(1, min(cap, view.max_running_requests))
    if chunk is not None:
        chunk = max(1, min(chunk, view.chunk_size)) if view.chunk_size > 0 else None
    return cap, chunk, prefill


def _tier_flips(c: ViewColumns, tier_at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The waiting positions of requests with an SLO whose tier `tier_at` changes (a view's tier
    flag is its SLO's best effort or the engine's declined mark), and those of class best
    effort, whose flag cannot tell."""
    nw = c.n_waiting
    in_tier = np.zeros(nw, dtype=bool)
    in_tier[tier_at] = True
    best_effort_class = c.cls[:nw] == BEST_EFFORT
    flips = (in_tier != c.be_tier[:nw]) & ~best_effort_class
    return flips.nonzero()[0], best_effort_class.nonzero()[0]
