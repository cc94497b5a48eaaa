"""Shortest job first on the predicted remaining output length (a baseline; JITServe App. D.1.2
shows it can be arbitrarily bad for goodput). Uses the analyzer's bound, else the client's
max_new_tokens, else a default: never the true length."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, predicted_totals
from scheduler.core.types import EngineView, StepPlan


@dataclass(frozen=True)
class SjfParams:
    default_output_len: float = DEFAULT_OUTPUT_LEN  # when neither a prediction nor max_new_tokens is known


class SjfPolicy:
    name = "sjf"
    slo_levers = False

    def __init__(self, params: SjfParams = SjfParams()) -> None:
        self.default_output_len = params.default_output_len

    def remaining(self, view: EngineView) -> np.ndarray:
        """Predicted remaining output tokens of each waiting request (the sort key)."""
        waiting = view.waiting
        generated = np.fromiter((r.generated for r in waiting), np.float64, len(waiting))
        return predicted_totals(waiting, generated, self.default_output_len) - generated

    def plan(self, view: EngineView) -> StepPlan:
        if not view.waiting:
            return StepPlan(order=[])
        arrival = np.fromiter((r.arrival for r in view.waiting), dtype=np.float64, count=len(view.waiting))
        idx = np.lexsort((arrival, self.remaining(view)))  # shortest first, ties by arrival
        return StepPlan(order=[view.waiting[i].rid for i in idx.tolist()])
