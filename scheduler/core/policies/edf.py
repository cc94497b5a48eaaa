"""Earliest deadline first on each request's next binding deadline.

Latency requests are keyed by their next token's DSLO due time (the first-token deadline while
waiting), deadline/compound requests by their end-to-end deadline; best-effort requests go last
in arrival order, so they still run whenever nothing with a deadline waits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.core.estimates import next_deadline
from scheduler.core.types import EngineView, RequestView, StepPlan


def deadline_key(req: RequestView) -> tuple[int, float, float]:
    deadline = next_deadline(req)
    if deadline is None:
        return (1, math.inf, req.arrival)
    return (0, deadline, req.arrival)


@dataclass(frozen=True)
class EdfParams:
    # True: EDF with the engine's SLO levers (slack-sized chunks, prefill gate, TPOT batch cap);
    # False (default): the papers' EDF baseline, EDF order on a stock engine
    slo_levers: bool = False


class EdfPolicy:
    name = "edf"

    def __init__(self, params: EdfParams = EdfParams()) -> None:
        self.slo_levers = params.slo_levers
        # rid -> (view, its generated count, key): the adapter and the simulator hand the same
        # view object to every pass, updated in place, and of what a key reads only the
        # generated count is ever updated, so most keys are reused (at 1k waiting, keying is
        # most of a pass). The view is held only to recognise it, never read after plan().
        self._keys: dict[str, tuple[RequestView, int, tuple[int, float, float]]] = {}

    def plan(self, view: EngineView) -> StepPlan:
        old = self._keys
        keys: dict[str, tuple[RequestView, int, tuple[int, float, float]]] = {}
        for r in view.waiting:
            hit = old.get(r.rid)
            if hit is None or hit[0] is not r or hit[1] != r.generated:
                hit = (r, r.generated, deadline_key(r))
            keys[r.rid] = hit
        self._keys = keys
        ordered = sorted(keys, key=lambda rid: keys[rid][2])
        return StepPlan(order=ordered)
