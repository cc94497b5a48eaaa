"""benchmarks.experiments.policy_sweep: the capacity bisection and the per-seed best-baseline ratio."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from benchmarks.experiments.policy_sweep import failing, find_capacity, versus_best


def _step(capacity: float, calls: list[float] | None = None) -> Any:
    def attain(rate: float) -> float:
        if calls is not None:
            calls.append(rate)
        return 1.0 if rate <= capacity else 0.5

    return attain


@pytest.mark.parametrize("start", [0.5, 4.0, 100.0])
def test_capacity_is_found_from_below_or_above_within_the_refinement(start: float) -> None:
    rate = find_capacity(_step(10.0), start=start, refine=4)
    assert rate is not None
    assert 10.0 / 2 ** (1 / 16) <= rate <= 10.0


def test_capacity_is_none_when_even_the_lowest_rate_misses_and_capped_when_none_does() -> None:
    calls: list[float] = []
    assert find_capacity(_step(0.01, calls), start=4.0, lowest=0.125) is None
    assert min(calls) >= 0.125
    assert find_capacity(_step(1e9), start=4.0, highest=64.0) == 64.0


def _m(goodput: float) -> Any:
    return SimpleNamespace(goodput_rps=goodput)


def test_each_seed_is_compared_with_its_own_best_ordering_baseline() -> None:
    seeds = [
        {"edf": _m(10.0), "sjf": _m(5.0), "las": _m(1.0), "sarathi": _m(1.0), "gmax": _m(9.0)},
        {"edf": _m(2.0), "sjf": _m(8.0), "las": _m(1.0), "sarathi": _m(1.0), "gmax": _m(8.0)},
    ]
    assert versus_best(seeds, "gmax") == pytest.approx([0.9, 1.0])


def test_a_row_fails_on_its_mean_and_on_nan() -> None:
    row = {"x_best": {"gmax": {"mean": 0.949}, "slos": {"mean": 0.95}, "tempo": {"mean": float("nan")}}}
    assert failing(row) == ["gmax", "tempo"]
