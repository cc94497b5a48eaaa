"""Sarathi-Serve baseline: a fixed per-iteration token budget shared by decodes and prefill chunks,
with requests admitted first come, first served.

Every running request decodes one token per iteration, so the prefill chunk is what is left of
the budget (never below `min_chunk`, so waiting prompts always progress, and never above the
engine's start-up chunk size)."""

from __future__ import annotations

from scheduler.core.types import EngineView, StepPlan


class SarathiPolicy:
    name = "sarathi"

    def __init__(self, token_budget: int = 512, count_decodes: bool = True, min_chunk: int = 1) -> None:
        if token_budget < 1 or min_chunk < 1:
            raise ValueError("token_budget and min_chunk must be >= 1")
        self.token_budget = token_budget
        self.count_decodes = count_decodes
        self.min_chunk = min_chunk

    def plan(self, view: EngineView) -> StepPlan:
        # A running request without its first token is still prefilling: it does not decode.
        decodes = sum(1 for r in view.running if r.first_token_time is not None) if self.count_decodes else 0
        budget = self.token_budget - decodes
        chunk = min(max(budget, self.min_chunk), max(1, view.chunk_size))
        order = sorted(view.waiting, key=lambda r: r.arrival)
        return StepPlan(order=[r.rid for r in order], chunk_size=chunk)
