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

from scheduler.core.types import RequestView


@dataclass(frozen=True)
class UnchangedRun:
    """queue[1:stop] are as the last pass left them, with these views and cache rows."""

    stop: int
    views: list[RequestView]
    rows: np.ndarray


class QueueSnapshot:
    def __init__(self) -> None:
        self.enabled = True
        self._viewed: tuple[list[RequestView], np.ndarray] | None = None  # this pass, before its plan
        self._applied: tuple[list[Any], list[RequestView], np.ndarray] | None = None

    def viewed(self, views: list[RequestView], rows: np.ndarray) -> None:
        """This pass's waiting views and their cache rows, in queue order before the plan."""
        self._viewed = (views, rows) if self.enabled else None

    def viewed_rids(self, queue: Sequence[Any], rids_of_rows: np.ndarray) -> list[str] | None:
        """The rids of `queue` when it is the viewed one, unchanged (`rids_of_rows`: the row
        cache's rid per row); else None."""
        viewed = self._viewed
        if viewed is None or len(viewed[0]) != len(queue):
            return None
        return rids_of_rows[viewed[1]].tolist()

    def applied(self, queue: Sequence[Any], perm: list[int] | None) -> None:
        """The plan's order is applied: `queue` holds the viewed requests moved by `perm`
        (`order_waiting`'s; None: not moved)."""
        viewed, self._viewed = self._viewed, None
        if viewed is None or len(viewed[0]) != len(queue):
            return
        views, rows = viewed
        if perm is not None:
            views, rows = list(map(views.__getitem__, perm)), rows[np.asarray(perm, dtype=np.int64)]
        self._applied = (list(queue), views, rows)

    def to_tail(self, rids: Set[str]) -> None:
        """The admission walk runs with these requests set aside; they rejoin the queue's tail
        after it (the adapter's lost hold)."""
        if self._applied is None or not rids:
            return
        queue, views, rows = self._applied
        staying = [i for i, v in enumerate(views) if v.rid not in rids]
        order = staying + [i for i, v in enumerate(views) if v.rid in rids]
        self._applied = ([queue[i] for i in order], [views[i] for i in order], rows[order])

    def unchanged(self, queue: Sequence[Any]) -> UnchangedRun | None:
        """The run of `queue` the last applied order left untouched, if the queue still starts
        with it (else None: the caller looks at every request). Good for one pass only."""
        applied, self._applied = self._applied, None
        if applied is None or not queue:
            return None
        old, views, rows = applied
        try:
            head = old.index(queue[0])  # how many the walk admitted (a few): the scan stops there
        except ValueError:
            return None  # the queue starts with a request the last pass did not leave there
        stop = len(old) - head
        if stop < 2 or len(queue) < stop or list(queue[:stop]) != old[head:]:
            return None  # something left from inside the run (an abort, a timeout) or moved
        return UnchangedRun(stop, views[head + 1 :], rows[head + 1 :])

    def forget(self) -> None:
        """Rows were renumbered, or the queue changed outside the plan: look at everyone."""
        self._viewed = self._applied = None
