"""A hard budget on a policy's search per scheduling pass, counted in work units.

A plan the engine waits for leaves the card idle, so the slowest pass matters, not the median:
a search whose cost grows with the square of the queue (the SLOs-Serve DP re-solving a freed
forced set, which slos_serve/soft_admission.py now decides in n log n) once stalled a live card for
seconds. Every search in a policy therefore runs under a `WorkBudget`; when it runs out, the
policy falls back to a plan it can form in linear time (its last promises, its greedy order)
and counts the pass, which /slo/status reports (`budget_fallbacks`).

The budget is in work units (states expanded, entries compared), not seconds: the same input
then always takes the same path, on a fast host or a busy one, and a test can exhaust it
without a clock. A policy's parameter states it in milliseconds of this host's Python,
converted with `units_for_ms`, whose rate the decision-latency benchmark calibrates
(`benchmarks/experiments/decision_latency.py --part plan-path`).
"""

from __future__ import annotations

# Work units one millisecond of search buys on a 2-core CPU host (the slowest host the
# benchmarks run on), a little under what the benchmark measures there: a faster host
# finishes the same budget sooner, which is the safe side.
UNITS_PER_MS = 8_000


class BudgetExhausted(Exception):
    """The search spent its budget: the caller falls back and counts the pass."""


def units_for_ms(ms: float | None) -> int | None:
    """The work units of a budget of `ms` milliseconds (None: unbounded)."""
    if ms is None:
        return None
    return max(1, int(ms * UNITS_PER_MS))


class WorkBudget:
    """Units left for one pass's search. `spend` raises `BudgetExhausted` once more than
    `limit` units are spent (None: never)."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.spent = 0

    def spend(self, units: int) -> None:
        self.spent += units
        if self.limit is not None and self.spent > self.limit:
            raise BudgetExhausted(f"search spent {self.spent} of {self.limit} work units")
