"""Which waiting requests SGLang cannot have changed since the last pass.

Between two passes SGLang touches a waiting request in one place only: its admission walk,
which goes down the queue in the order the last plan applied, admits a head of it and stops at
the first request that does not fit, after re-matching that one's prefix. Arrivals and
retractions join the tail; an abort or a timeout removes requests anywhere. So when the queue
now starts with what the applied order left after its admitted head, in that order, every
request of that run but its first is as the last pass saw it, and the view builder need not
look at it: at thousands waiting, that look is most of a pass's view building.

This holds while SGLang's own policy leaves the queue alone between passes, as FCFS does with
a radix cache that has no fast prefix match (SGLang 0.5.17's caches); the adapter turns the
snapshot off otherwise. A pass that is not followed by `applied` (a plan that dropped
requests, a rank that does not plan) leaves no snapshot, so the next pass looks at everyone.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class UnchangedRun:
    """queue[1:stop] are as the last pass left them, at these rows of the builder's RowCache."""

    stop: int
    rows: np.ndarray


class QueueSnapshot:
    """Kept as row numbers: the views behind them are the row cache's, so moving 10 000
    requests costs one numpy gather, not a Python step per request."""

    def __init__(self) -> None:
        self.enabled = True
        self._viewed: np.ndarray | None = None  # this pass's waiting rows, before its plan
        self._applied: tuple[list[Any], np.ndarray] | None = None  # the queue as applied, its rows

    def viewed(self, rows: np.ndarray) -> None:
        """This pass's waiting requests' cache rows, in queue order before the plan."""
        self._viewed = rows if self.enabled else None

    def viewed_rids(self, queue: Sequence[Any], rids_of_rows: np.ndarray) -> list[str] | None:
        """The rids of `queue` when it is the viewed one, unchanged (`rids_of_rows`: the row
        cache's rid per row); else None."""
        rows = self._viewed
        if rows is None or len(rows) != len(queue):
            return None
        return rids_of_rows[rows].tolist()

    def applied(self, queue: Sequence[Any], perm: np.ndarray | None) -> None:
        """The plan's order is applied: `queue` holds the viewed requests moved by `perm`
        (`order_waiting`'s; None: not moved)."""
        rows, self._viewed = self._viewed, None
        if rows is None or len(rows) != len(queue):
            return
        if perm is not None:
            rows = rows[perm]
        self._applied = (list(queue), rows)

    def to_tail(
        self,
        rids: Set[str],
        rids_of_rows: np.ndarray,
        at: np.ndarray | None = None,
        kept: list[Any] | None = None,
        held: list[Any] | None = None,
    ) -> None:
        """The admission walk runs with these requests set aside; they rejoin the queue's tail
        after it (the adapter's lost hold). `at`: their positions in the applied queue; with
        it, `kept` and `held`: that queue's two parts as they leave it (set_aside's), when the
        caller has them."""
        if self._applied is None or not rids:
            return
        queue, rows = self._applied
        n = len(rows)
        if at is not None and len(at) and at[0] == n - len(at):  # ascending: already the tail
            return
        if at is not None:
            is_held = np.zeros(n, dtype=bool)
            is_held[at] = True
        else:
            is_held = np.fromiter(map(rids.__contains__, rids_of_rows[rows].tolist()), dtype=bool, count=n)
        order = np.concatenate([(~is_held).nonzero()[0], is_held.nonzero()[0]])
        if at is not None and kept is not None and held is not None and len(kept) + len(held) == len(queue):
            moved = [*kept, *held]
        else:
            moved = list(map(queue.__getitem__, order.tolist()))
        self._applied = (moved, rows[order])

    def unchanged(self, queue: Sequence[Any]) -> UnchangedRun | None:
        """The run of `queue` the last applied order left untouched, if the queue still starts
        with it (else None: the caller looks at every request). Good for one pass only."""
        applied, self._applied = self._applied, None
        if applied is None or not queue:
            return None
        old, rows = applied
        try:
            head = old.index(queue[0])  # how many the walk admitted (a few): the scan stops there
        except ValueError:
            return None  # the queue starts with a request the last pass did not leave there
        stop = len(old) - head
        if stop < 2 or len(queue) < stop or list(queue[:stop]) != old[head:]:
            return None  # something left from inside the run (an abort, a timeout) or moved
        return UnchangedRun(stop, rows[head + 1 :])

    def forget(self) -> None:
        """Rows were renumbered, or the queue changed outside the plan: look at everyone."""
        self._viewed = self._applied = None
