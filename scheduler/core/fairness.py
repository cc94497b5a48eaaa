"""Fair shares between tenants (API keys), blended into any policy's order.

An SLO is a priority, so a tenant that floods the server, or asks for the tightest targets its
key allows, takes capacity from every other tenant under any SLO-aware order. Tempo §4.3 and
JITServe §4.3 both answer with a blend: priority'(r) = (1 − f)·priority(r) + f·Fair(r), where
Fair favours the tenants with the least fairness attainment (VTC, Sheng et al., OSDI '24).

Our policies do not share a priority scale (EDF orders by due times, Tempo and GMAX by
densities, SJF by lengths), so priority(r) is the request's place in the policy's own order,
normalised to [0, 1] (1: first), which every policy has:

- each tenant has a virtual counter, the tokens served to it (prompt and output, as VTC counts
  them) divided by its share, so equal counters mean service in proportion to the shares; a
  tenant that comes back after its queue emptied is lifted to the least counter among the
  tenants still waiting, so idleness banks no credit (VTC's lift);
- Fair(tenant) is where its counter lies between the waiting tenants' largest (0) and least
  (1): the tenant furthest behind its share gets the most;
- the order is by priority'(r) = (1 − f)·priority(r) + f·Fair(tenant of r), ties in the
  policy's order; so each tenant's own requests keep the policy's order, and with f ≥ 0.5 the
  tenant furthest behind goes first until its counter catches up (VTC), while a smaller f lets
  the policy's most urgent requests of other tenants pass it.

This is fairness between API keys. Tempo's and GMAX's own `fairness` parameter (`--slo-fairness`,
off by default) blends the same way between requests, by each program's attained service; the
two compose: that one shapes the policy's order, this one its split between keys.

With one tenant (or none) waiting, or counters all even, the policy's order is kept as it is:
a single-tenant server plans exactly as before. The counters are the only state; an engine
(the adapter's planner, the simulator's engine) keeps one FairShare next to its policy and the
plan path calls it every pass, so both engines blend alike.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.pass_columns import columns_of
from scheduler.core.types import EngineView, StepPlan

DEFAULT_TENANT_FAIRNESS = 0.5  # f: the weight of the fair order against the policy's own
_NO_TENANT = -1


class FairShare:
    """Per-tenant virtual counters across passes, and the blend of one pass's order."""

    def __init__(self) -> None:
        self._vt: dict[int, float] = {}  # tenant id -> tokens served / share
        self._served: dict[str, float] = {}  # running rid -> its tokens already counted
        self._backlogged: set[int] = set()  # tenants that had waiting work last pass

    def counters(self) -> dict[int, float]:
        """The virtual counters (tenant id -> tokens served / share), for tests and status."""
        return dict(self._vt)

    def blend(self, view: EngineView, plan: StepPlan, f: float) -> StepPlan:
        """`plan` with its order blended with the tenants' fair shares (weight `f`); `plan`
        itself when fewer than two tenants wait, their counters are even, or f is 0."""
        if f <= 0.0 or not (view.waiting or self._vt):
            return plan
        c = columns_of(view)
        tenant = c.tenant
        if self._vt or (tenant != _NO_TENANT).any():
            self._observe(c, tenant)
        nw = c.n_waiting
        if nw == 0 or tenant[:nw].min() == tenant[:nw].max():
            return plan  # one tenant waiting (the usual server): no sort of the queue's tenants
        waiting_tenants, at = np.unique(tenant[:nw], return_inverse=True)
        if waiting_tenants.size < 2:
            return plan
        vt = np.array([self._vt.get(t, 0.0) for t in waiting_tenants.tolist()])
        spread = vt.max() - vt.min()
        if not spread > 0.0:
            return plan
        fair = ((vt.max() - vt) / spread)[at]  # per waiting row: 1 for the tenant furthest behind
        listed = _base_order(plan, c)  # only the rows the policy listed; the engine puts the rest after
        priority = 1.0 - np.arange(listed.size) / listed.size
        score = (1.0 - f) * priority + f * fair[listed]
        order_at = listed[np.lexsort((np.arange(listed.size), -score))]
        return dataclasses.replace(plan, order=c.rid_array[order_at].tolist(), order_at=order_at)

    def _observe(self, c: ViewColumns, tenant: np.ndarray) -> None:
        """Charge each tenant what its running requests were served since the last pass, then
        lift the tenants that just got waiting work to the least counter of those with work."""
        nw, share = c.n_waiting, c.share
        served = c.prompt[nw:] + c.generated[nw:]
        seen = self._served
        now_served: dict[str, float] = {}
        charge: dict[int, float] = {}
        for rid, t, s, w in zip(c.rids[nw:], tenant[nw:].tolist(), served.tolist(), share[nw:].tolist(), strict=True):
            now_served[rid] = s
            delta = s - seen.get(rid, 0.0)
            if delta > 0:
                charge[t] = charge.get(t, 0.0) + delta / w
        self._served = now_served
        vt = self._vt
        for t, amount in charge.items():
            vt[t] = vt.get(t, 0.0) + amount
        backlogged = set(np.unique(tenant[:nw]).tolist())
        active = backlogged | set(np.unique(tenant[nw:]).tolist())
        for t in [t for t in vt if t not in active]:
            del vt[t]  # no work left: its counter goes, a return is lifted
        fresh = backlogged - self._backlogged
        floor = min((vt[t] for t in backlogged - fresh if t in vt), default=None)
        for t in fresh:
            vt[t] = max(vt.get(t, 0.0), floor) if floor is not None else vt.get(t, 0.0)
        for t in active:
            vt.setdefault(t, 0.0)
        self._backlogged = backlogged
        low = min(vt.values(), default=0.0)
        if low > 0.0:
            for t in vt:
                vt[t] -= low  # only differences matter: keep the numbers small


def _base_order(plan: StepPlan, c: ViewColumns) -> np.ndarray:
    """The policy's order as positions in the waiting list (all of it when the policy leaves
    the queue's own order)."""
    nw = c.n_waiting
    if plan.order_at is not None:
        return np.asarray(plan.order_at, dtype=np.int64)
    if plan.order is None:
        return np.arange(nw, dtype=np.int64)
    pos = {rid: i for i, rid in enumerate(c.rids[:nw])}
    return np.array([p for p in (pos.get(rid) for rid in plan.order) if p is not None], dtype=np.int64)
