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
from itertools import compress

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import BEST_EFFORT, losing_deadline
from scheduler.core.pass_columns import columns_of
from scheduler.core.types import EngineView, RequestView


def past_due(r: RequestView, now: float) -> bool:
    """A request that has not started and whose first binding deadline (its first token's due
    time, or its end-to-end deadline: a compound stage's program deadline, not its
    sub-deadline) has passed: lost under any schedule."""
    if r.started:
        return False
    due = losing_deadline(r)
    return due is not None and due < now


def held_lost_causes(
    view: EngineView,
    best_effort: Collection[str],
    columns: ViewColumns | None = None,
) -> frozenset[str]:
    """The waiting rids in the best-effort tier that are past due (`past_due`, on the view's
    columns), while SLO work is in the engine (running outside the tier, or waiting outside
    it); empty otherwise. With the tier as positions, `held_lost_at`."""
    if not best_effort:
        return frozenset()
    c = columns if columns is not None else columns_of(view)
    nw = c.n_waiting
    past = ~c.started[:nw] & (c.losing_due[:nw] < view.now)  # nan (no deadline): never due
    rids = c.rids
    lost = frozenset(best_effort).intersection(compress(rids, past.tolist()))
    if not lost:
        return frozenset()
    cls = c.cls
    slo_work = bool((~c.be_tier[nw:] & (cls[nw:] != BEST_EFFORT)).any()) or any(
        rids[i] not in best_effort for i in (cls[:nw] != BEST_EFFORT).nonzero()[0].tolist()
    )
    return lost if slo_work else frozenset()


def held_lost_at(view: EngineView, tier_at: np.ndarray, columns: ViewColumns | None = None) -> np.ndarray:
    """`held_lost_causes` with the tier as waiting positions, and the held requests' positions
    out (ascending): masks instead of rid sets, and what the engine sets aside by position."""
    if len(tier_at) == 0:
        return np.zeros(0, dtype=np.int64)
    c = columns if columns is not None else columns_of(view)
    nw = c.n_waiting
    past = ~c.started[:nw] & (c.losing_due[:nw] < view.now)
    in_tier = np.zeros(nw, dtype=bool)
    in_tier[tier_at] = True
    lost = (in_tier & past).nonzero()[0]
    if lost.size == 0:
        return lost
    cls = c.cls
    slo_work = bool((~c.be_tier[nw:] & (cls[nw:] != BEST_EFFORT)).any()) or bool(
        (~in_tier & (cls[:nw] != BEST_EFFORT)).any()
    )
    return lost if slo_work else lost[:0]
