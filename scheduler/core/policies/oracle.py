"""Oracle variants (benchmarks only): a policy that plans with the true output length.

They bound what better length prediction could buy. The true length reaches a request only
through a benchmark hint (`custom_params.slo_oracle_output_len`), and the adapter passes it
on only to policies whose name ends in `_oracle`; every other policy never sees it.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import chain
from typing import Any, TypeVar

from scheduler.core.registry import Entry
from scheduler.core.types import EngineView, Policy, RequestView, StepPlan

C = TypeVar("C")

ORACLE_SUFFIX = "_oracle"


def _with_truth(r: RequestView) -> RequestView:
    if r.oracle_output_len is None:
        return r
    return replace(r, predicted_output_len=float(max(r.oracle_output_len, r.generated + 1)))


class OracleVariant:
    def __init__(self, base: Policy, name: str) -> None:
        self.base = base
        self.name = name
        self.slo_levers = base.slo_levers
        self.chunk_cap = getattr(base, "chunk_cap", None)
        self.chunk_step_ratio = getattr(base, "chunk_step_ratio", None)
        self.prefill_alone = getattr(base, "prefill_alone", False)

    @property
    def budget_fallbacks(self) -> int:
        return getattr(self.base, "budget_fallbacks", 0)

    def plan(self, view: EngineView) -> StepPlan:
        if all(r.oracle_output_len is None for r in chain(view.waiting, view.running)):
            return self.base.plan(view)  # nothing to tell: the same views (and the pass's columns)
        waiting = [_with_truth(r) for r in view.waiting]
        running = [_with_truth(r) for r in view.running]
        return self.base.plan(replace(view, waiting=waiting, running=running))


def oracle_of(base: Entry[C, Policy]) -> Entry[C, Policy]:
    """The registry entry of `base`'s oracle variant: the same parameters, the same context."""
    name = base.name + ORACLE_SUFFIX

    def make(params: Any, context: C) -> Policy:
        return OracleVariant(base.factory(params, context), name)

    return Entry(name, base.params_type, make)
