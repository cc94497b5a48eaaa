"""Autellix-style program-level least attained service (PLAS), a non-clairvoyant baseline.

Requests are ranked by the service their program has received so far (RequestView.
attained_service: prefill + decode tokens), discretised into levels so that programs of similar
age share a level and run FCFS inside it (Autellix's multi-level queue). A request waiting longer
than `starvation_s` is promoted to the top level. At preemption quanta, a running request whose
level is strictly worse than a waiting one's is swapped out, so long programs yield to new ones."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import lexsort_fast, quantum_boundary
from scheduler.core.pass_columns import columns_of
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView, StepPlan

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
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    def levels(self, attained: np.ndarray, arrival: np.ndarray, now: float) -> np.ndarray:
        """Priority level per request (lower runs first): the attained-service bucket, or the
        raw attained service when no thresholds are set; starving requests get level -1."""
        lv = attained if self.thresholds is None else np.searchsorted(self.thresholds, attained, side="right")
        lv = lv.astype(np.float64)
        if self.starvation_s is not None and len(lv):
            lv = np.where(now - arrival > self.starvation_s, -1.0, lv)
        return lv

    def plan(self, view: EngineView) -> StepPlan:
        """On the pass's columns, as positions: at 10 000 waiting a Python read of each view's
        fields was most of a pass."""
        c = columns_of(view, self._slos)
        nw = c.n_waiting
        arrival, attained = c.arrival, c.attained
        wl = self.levels(attained[:nw], arrival[:nw], view.now)
        idx = lexsort_fast((arrival[:nw], wl))
        plan = StepPlan(order=c.rid_array[idx].tolist(), order_at=idx)
        if self.preempt and nw and view.running and quantum_boundary(view.step, self.quantum_steps):
            rl = self.levels(attained[nw:], arrival[nw:], view.now)
            plan.preempt = self._victims(view, wl[idx], rl, arrival[nw:])
        return plan

    def _victims(
        self, view: EngineView, sorted_waiting_levels: np.ndarray, rl: np.ndarray, ra: np.ndarray
    ) -> list[str]:
        free = max(0, view.max_running_requests - len(view.running))
        contenders = sorted_waiting_levels[free:]
        if contenders.size == 0:
            return []
        running = view.running
        ridx = np.lexsort((-ra, -rl))  # worst level first, newest first inside a level
        victims: list[str] = []
        for level_in, i in zip(contenders.tolist(), ridx.tolist(), strict=False):
            if level_in < rl[i]:
                victims.append(running[i].rid)
            else:
                break
        return victims
