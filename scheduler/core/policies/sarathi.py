"""Sarathi-Serve baseline: a fixed per-iteration token budget shared by decodes and prefill chunks,
with requests admitted first come, first served.

Every running request decodes one token per iteration, so the prefill chunk is what is left of
the budget (never below `min_chunk`, so waiting prompts always progress, and never above the
engine's start-up chunk size)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from scheduler.core.estimates import lexsort_fast
from scheduler.core.pass_columns import columns_of
from scheduler.core.registry import require
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView, StepPlan


@dataclass(frozen=True)
class SarathiParams:
    token_budget: int = 512  # tokens per iteration, decodes and the prefill chunk together
    count_decodes: bool = True
    min_chunk: int = 1

    def __post_init__(self) -> None:
        require(self.token_budget >= 1, "token_budget", "must be >= 1", self.token_budget)
        require(self.min_chunk >= 1, "min_chunk", "must be >= 1", self.min_chunk)


class SarathiPolicy:
    name = "sarathi"
    slo_levers = False

    def __init__(self, params: SarathiParams = SarathiParams()) -> None:
        self.token_budget = params.token_budget
        self.count_decodes = params.count_decodes
        self.min_chunk = params.min_chunk
        self._slos = SloTable()  # per-SloSpec numbers, read once per spec, not every step

    def plan(self, view: EngineView) -> StepPlan:
        c = columns_of(view, self._slos)
        nw = c.n_waiting
        # A running request without its first token is still prefilling: it does not decode.
        decodes = int(np.count_nonzero(c.started[nw:])) if self.count_decodes else 0
        budget = self.token_budget - decodes
        chunk = min(max(budget, self.min_chunk), max(1, view.chunk_size))
        order_at = lexsort_fast((c.arrival[:nw],))  # first come, first served (stable)
        return StepPlan(order=c.rid_array[order_at].tolist(), chunk_size=chunk, order_at=order_at)
