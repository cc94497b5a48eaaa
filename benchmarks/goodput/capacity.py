"""Capacity: the highest arrival rate a server sustains at a target SLO attainment.

Attainment falls as the rate grows (not strictly, these machines are noisy), so the search
first doubles the rate until a probe misses the target, then bisects between the last rate
that met it and the first that did not. Every probe is a full benchmark run, so the number of
probes is bounded; the answer is the best rate that *was measured* to meet the target.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class CapacityResult:
    target: float
    capacity_rate: float | None  # None: even the starting rate missed the target
    probes: list[tuple[float, float]] = field(default_factory=list)  # (rate, attainment) in probe order

    @property
    def bracket(self) -> tuple[float | None, float | None]:
        """(highest rate that met the target, lowest rate that missed it)."""
        met = [r for r, a in self.probes if a >= self.target]
        missed = [r for r, a in self.probes if a < self.target]
        return (max(met) if met else None, min(missed) if missed else None)


def search_capacity(
    attainment_at: Callable[[float], float],
    start_rate: float,
    target: float = 0.9,
    max_probes: int = 6,
    rel_tol: float = 0.1,
) -> CapacityResult:
    """Binary search for the largest rate with attainment_at(rate) >= target."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"target attainment must be in (0, 1], got {target}")
    if not start_rate > 0:
        raise ValueError(f"start rate must be > 0, got {start_rate}")
    if max_probes < 1:
        raise ValueError(f"max_probes must be >= 1, got {max_probes}")
    result = CapacityResult(target=target, capacity_rate=None)

    def probe(rate: float) -> bool:
        attained = attainment_at(rate)
        result.probes.append((rate, attained))
        return attained >= target

    lo: float | None = None  # a rate that met the target
    hi: float | None = None  # a rate that missed it
    rate = start_rate
    while len(result.probes) < max_probes:  # bracket: double while met, halve while missed
        if probe(rate):
            lo = rate
        else:
            hi = rate
        if lo is not None and hi is not None:
            break
        rate = rate * 2.0 if hi is None else rate / 2.0
    while len(result.probes) < max_probes and lo is not None and hi is not None and hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2.0
        if probe(mid):
            lo = mid
        else:
            hi = mid
    result.capacity_rate = result.bracket[0]
    return result
