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

    def plan(self, view: EngineView) -> StepPlan:
        ordered = sorted(view.waiting, key=deadline_key)
        return StepPlan(order=[r.rid for r in ordered])
