"""Shortest job first on the predicted remaining output length (a baseline; JITServe App. D.1.2
shows it can be arbitrarily bad for goodput). Uses the analyzer's bound, else the client's
max_new_tokens, else a default: never the true length."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, lexsort_fast
from scheduler.core.pass_columns import columns_of
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView, StepPlan


@dataclass(frozen=True)
class SjfParams:
    default_output_len: float = DEFAULT_OUTPUT_LEN  # when neither a prediction nor max_new_tokens is known


class SjfPolicy:
    name = "sjf"
    slo_levers = False

    def __init__(self, params: SjfParams = SjfParams()) -> None:
        self.default_output_len = params.default_output_len
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    def remaining(self, view: EngineView) -> np.ndarray:
        """Predicted remaining output tokens of each waiting request (the sort key)."""
        c = columns_of(view, self._slos)
        nw = c.n_waiting
        return c.total_out(self.default_output_len)[:nw] - c.generated[:nw]

    def plan(self, view: EngineView) -> StepPlan:
        """The order as positions, on the pass's columns: at 10 000 waiting a Python read of
        each view's fields was most of a pass."""
        if not view.waiting:
            return StepPlan(order=[])
        c = columns_of(view, self._slos)
        order_at = lexsort_fast((c.arrival[: c.n_waiting], self.remaining(view)))  # shortest first, ties by arrival
        return StepPlan(order=c.rid_array[order_at].tolist(), order_at=order_at)
