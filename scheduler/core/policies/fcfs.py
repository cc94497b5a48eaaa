"""First come, first served: leaves SGLang's own order untouched (stock behaviour)."""

from __future__ import annotations

from scheduler.core.types import EngineView, StepPlan


class FcfsPolicy:
    name = "fcfs"
    slo_levers = False

    def plan(self, view: EngineView) -> StepPlan:
        return StepPlan()
