"""Which best-effort-tier requests wait for a lull instead of starting now, and which running
ones give their slot back to SLO work.

SLOs-Serve's best-effort tier (§4.1) runs on capacity the SLO requests leave over, and the
requests it takes during a burst are served in the quieter period after it (its Fig. 11). A
tier that is only "last in the queue" is not that: between two arrivals a lost request starts,
and for its whole answer it holds a batch slot, KV and decode time that the next SLO requests
need. A waiting request whose next token or deadline is already past can no longer meet its
SLO under any schedule, so while any request with an SLO still to keep is in the engine it is
held: not started, not dropped (its client still gets the whole answer, later). Requests that
were declined but may still make it are not held: admission reconsiders them every pass.

A tier request that started in a lull keeps its slot after it, and a tier that fills the
batch in a lull leaves the next requests with an SLO no room under the batch cap: they wait
for lost requests' whole answers and lose their own first tokens, and then they are lost in
turn. So a running tier request whose SLO is lost yields its slot (it is retracted, as a
preemption, and resumes later from the tokens it has) where the cap leaves the SLO work
waiting no room, or the running batch is over the cap that work sets. Once retracted it is a
waiting lost request like any other, held until the SLO work is done: resumed at the next free
slot, it would prefill its prompt and tokens again only to be retracted by the next arrival,
and under sustained load that churn costs the SLO work more compute than the slot gave it.
"""

from __future__ import annotations

from collections.abc import Collection, Set
from itertools import compress, islice

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.estimates import BEST_EFFORT, losing_deadline
from scheduler.core.pass_columns import columns_of
from scheduler.core.types import EngineView, RequestView


def past_due(r: RequestView, now: float) -> bool:
    """A request whose next binding deadline (its next token's due time, the first one's before
    it starts, or its end-to-end deadline: a compound stage's program deadline, not its
    sub-deadline) has passed: lost under any schedule."""
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
    past = c.losing_due[:nw] < view.now  # nan (no deadline): never due
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
    past = c.losing_due[:nw] < view.now
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


def tier_lost(c: ViewColumns, now: float) -> np.ndarray:
    """The requests of the best-effort tier, waiting or running, whose SLO is already lost (a
    best-effort job has none to lose): the plan path keeps them out of the SLO work's batch,
    held while waiting and retracted where they take its room."""
    return c.be_tier & (c.cls != BEST_EFFORT) & (c.losing_due < now)


def yielding_lost(
    view: EngineView,
    cap: int,
    tier_at: np.ndarray | None,
    tier: Set[str],
    dropped: Set[str],
    preempted: Collection[str],
    columns: ViewColumns | None = None,
) -> list[str]:
    """The decoding requests of the tier whose SLO is lost (their next token, deadline or a
    compound stage's program deadline already past; a best-effort job has none to lose) to
    retract so that the batch, less `preempted`, leaves room under `cap` for every waiting
    request with an SLO outside the tier (`tier_at` its waiting positions, else `tier` its
    rids), less those `dropped` this pass. Fewest tokens out first: the least work to redo
    when each resumes."""
    c = columns if columns is not None else columns_of(view)
    nw = c.n_waiting
    run = slice(nw, None)
    lost = tier_lost(c, view.now)[run] & c.started[run]  # a prefill in flight cannot be retracted
    if not lost.any():
        return []
    if tier_at is not None:
        in_tier = np.zeros(nw, dtype=bool)
        in_tier[tier_at] = True
    else:
        in_tier = np.fromiter((rid in tier for rid in c.rids[:nw]), dtype=bool, count=nw)
    slo_waiting = ~in_tier & (c.cls[:nw] != BEST_EFFORT)
    if dropped:
        slo_waiting &= np.fromiter((rid not in dropped for rid in c.rids[:nw]), dtype=bool, count=nw)
    waiting = int(np.count_nonzero(slo_waiting))
    excess = waiting + len(view.running) - len(preempted) - cap
    if excess <= 0:
        return []
    at = lost.nonzero()[0]
    rids = c.rids
    candidates = (rids[nw + i] for i in at[np.argsort(c.generated[run][at], kind="stable")].tolist())
    return list(islice((rid for rid in candidates if rid not in preempted), excess))
