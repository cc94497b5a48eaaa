"""Capacity search against known attainment curves (no server: the curve is the system)."""

from __future__ import annotations

import pytest

from benchmarks.goodput.capacity import search_capacity


def _step(capacity: float):
    return lambda rate: 1.0 if rate <= capacity else 0.5


@pytest.mark.parametrize("true_capacity, start", [(3.3, 1.0), (0.3, 1.0), (1.0, 1.0), (40.0, 0.5)])
def test_the_answer_meets_the_target_and_is_within_tolerance(true_capacity: float, start: float) -> None:
    res = search_capacity(_step(true_capacity), start, target=0.9, max_probes=12, rel_tol=0.05)
    assert res.capacity_rate is not None
    assert res.capacity_rate <= true_capacity
    assert res.capacity_rate >= true_capacity / 1.05 - 1e-9  # the final bracket is within rel_tol


def test_the_probe_budget_is_respected() -> None:
    calls: list[float] = []

    def curve(rate: float) -> float:
        calls.append(rate)
        return 1.0 if rate <= 7.7 else 0.0

    res = search_capacity(curve, 1.0, max_probes=4)
    assert len(calls) == 4 == len(res.probes)
    assert res.capacity_rate == 4.0  # 1, 2, 4 met, 8 missed: no probe left to bisect


def test_a_server_that_misses_at_every_rate_has_no_capacity() -> None:
    res = search_capacity(lambda rate: 0.0, 1.0, max_probes=5)
    assert res.capacity_rate is None
    assert [r for r, _ in res.probes] == [1.0, 0.5, 0.25, 0.125, 0.0625]


def test_a_noisy_dip_never_reports_a_rate_that_was_measured_to_miss() -> None:
    curve = {1.0: 1.0, 2.0: 0.95, 4.0: 0.5, 3.0: 0.85, 2.5: 0.92}
    res = search_capacity(lambda r: curve.get(r, 0.0), 1.0, max_probes=6, rel_tol=0.1)
    met = {r for r, a in res.probes if a >= 0.9}
    assert res.capacity_rate in met
    assert res.capacity_rate == 2.5


@pytest.mark.parametrize("kwargs", [{"target": 0.0}, {"target": 1.5}, {"max_probes": 0}])
def test_bad_arguments_name_the_problem(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        search_capacity(lambda r: 1.0, 1.0, **kwargs)
