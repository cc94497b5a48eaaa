"""Which best-effort-tier requests wait for a lull instead of starting now.

SLOs-Serve's best-effort tier (§4.1) runs on capacity the SLO requests leave over, and the
requests it takes during a burst are served in the quieter period after it (its Fig. 11). A
tier that is only "last in the queue" is not that: between two arrivals a lost request starts,
and for its whole answer it holds a batch slot, KV and decode time that the next SLO requests
need. A waiting request whose first token or deadline is already past can no longer meet its
SLO under any schedule, so while any request with an SLO still to keep is in the engine it is
held: not started, not dropped (its client still gets the whole answer, later). Requests that
were declined but may still make it are not held: admission reconsiders them every pass.
"""

from __future__ import annotations

from collections.abc import Collection

from scheduler.core.estimates import next_deadline
from scheduler.core.types import EngineView, RequestView


def past_due(r: RequestView, now: float) -> bool:
    """A request that has not started and whose first binding deadline (its first token's due
    time, or its end-to-end deadline) has passed: lost under any schedule."""
    if r.started:
        return False
    due = next_deadline(r)
    return due is not None and due < now


def held_lost_causes(view: EngineView, best_effort: Collection[str]) -> frozenset[str]:
    """The waiting rids in the best-effort tier that are past due, while SLO work is in the
    engine (running outside the tier, or waiting outside it); empty otherwise."""
    if not best_effort:
        return frozenset()
    now = view.now
    lost = [r.rid for r in view.waiting if r.rid in best_effort and past_due(r, now)]
    if not lost:
        return frozenset()
    slo_work = any(not (r.best_effort_tier or r.slo.is_best_effort) for r in view.running) or any(
        r.rid not in best_effort and not r.slo.is_best_effort for r in view.waiting
    )
    return frozenset(lost) if slo_work else frozenset()
