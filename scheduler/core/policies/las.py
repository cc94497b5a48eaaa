"""Autellix-style program-level least attained service (PLAS), a non-clairvoyant baseline.

Requests are ranked by the service their program has received so far (RequestView.
attained_service: prefill + decode tokens), discretised into levels so that programs of similar
age share a level and run FCFS inside it (Autellix's multi-level queue). A request waiting longer
than `starvation_s` is promoted to the top level. At preemption quanta, a running request whose
level is strictly worse than a waiting one's is swapped out, so long programs yield to new ones."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import quantum_boundary
from scheduler.core.types import EngineView, RequestView, StepPlan

DEFAULT_THRESHOLDS = (512.0, 2048.0, 8192.0, 32768.0)


@dataclass(frozen=True)
class LasParams:
    level_thresholds: tuple[float, ...] | None = DEFAULT_THRESHOLDS  # None: rank by raw attained service
    starvation_s: float | None = 30.0  # None: no promotion
    preempt: bool = True
    quantum_steps: int = 20


class LasPolicy:
    name = "las"
    slo_levers = False

    def __init__(self, params: LasParams = LasParams()) -> None:
        levels = params.level_thresholds
        self.thresholds = np.asarray(sorted(levels), dtype=np.float64) if levels else None
        self.starvation_s = params.starvation_s
        self.preempt = params.preempt
        self.quantum_steps = params.quantum_steps

    def levels(self, reqs: Sequence[RequestView], now: float) -> np.ndarray:
        """Priority level per request (lower runs first): the attained-service bucket, or the
        raw attained service when no thresholds are set; starving requests get level -1."""
        attained = np.fromiter((r.attained_service for r in reqs), dtype=np.float64, count=len(reqs))
        lv = attained if self.thresholds is None else np.searchsorted(self.thresholds, attained, side="right")
        lv = lv.astype(np.float64)
        if self.starvation_s is not None and len(reqs):
            arrival = np.fromiter((r.arrival for r in reqs), dtype=np.float64, count=len(reqs))
            lv = np.where(now - arrival > self.starvation_s, -1.0, lv)
        return lv

    def plan(self, view: EngineView) -> StepPlan:
        waiting = view.waiting
        arrival = np.fromiter((r.arrival for r in waiting), dtype=np.float64, count=len(waiting))
        wl = self.levels(waiting, view.now)
        idx = np.lexsort((arrival, wl))
        plan = StepPlan(order=[waiting[i].rid for i in idx.tolist()])
        if self.preempt and waiting and view.running and quantum_boundary(view.step, self.quantum_steps):
            plan.preempt = self._victims(view, wl[idx])
        return plan

    def _victims(self, view: EngineView, sorted_waiting_levels: np.ndarray) -> list[str]:
        free = max(0, view.max_running_requests - len(view.running))
        contenders = sorted_waiting_levels[free:]
        if contenders.size == 0:
            return []
        running = view.running
        rl = self.levels(running, view.now)
        ra = np.fromiter((r.arrival for r in running), dtype=np.float64, count=len(running))
        ridx = np.lexsort((-ra, -rl))  # worst level first, newest first inside a level
        victims: list[str] = []
        for level_in, i in zip(contenders, ridx, strict=False):
            if level_in < rl[i]:
                victims.append(running[i].rid)
            else:
                break
        return victims
