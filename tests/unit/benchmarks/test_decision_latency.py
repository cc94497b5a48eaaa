"""The decision-latency benchmark, at toy sizes: every registered SLO policy and routing policy is
built from its registry and timed without an error, and the DP row is there."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from benchmarks.experiments.decision_latency import MIGRATION_ROW, bench_dp, bench_policies, bench_routing
from benchmarks.experiments.plan_path_latency import _median_run, bench_plan_path
from benchmarks.experiments.plan_path_states import adversarial_states, usual_state
from router.policies import ROUTING_POLICIES
from scheduler.core.policies import POLICIES


@pytest.fixture(autouse=True)
def _suite_heap_frozen() -> Iterator[None]:
    """The benchmark collects garbage before each cell (what a server running one policy never
    carries); in a full test run that scans every object the suite has built, for every cell.
    Frozen, the collector scans only what the benchmark made, as in its own process."""
    gc.freeze()
    yield
    gc.unfreeze()


def test_every_slo_policy_plans_a_synthetic_view() -> None:
    rows = bench_policies(queued=(20,), running=4)
    assert list(rows) == list(POLICIES)
    assert all(isinstance(row[20], float) for row in rows.values()), rows
    dp = bench_dp(new=3, running=10, repeats=2)
    assert set(dp) == {"dp_10_new_200_running_ms", "slos_plan_10_new_200_running_ms"}


def test_every_slo_policy_runs_the_adapters_plan_path_on_every_state() -> None:
    """Views, plan, the order applied and the lost hold set aside, as the adapter does them, on
    the usual mix and on every adversarial state; each cell has its tail and its fallbacks."""
    states = [(usual_state(60, running=8), 3)] + [(s, 2) for s in adversarial_states(30)]
    rows = bench_plan_path(states)
    assert list(rows) == ["60", "forced", "tiers", "compound", "ties", "preempt"]
    for state, cells in rows.items():
        assert list(cells) == list(POLICIES)
        for name, cell in cells.items():
            assert isinstance(cell, dict), (state, name, cell)
            assert cell["p50"] <= cell["p99"] <= cell["max"] and cell["budget_fallbacks"] >= 0
            assert cell["cpu"]["p50"] <= cell["cpu"]["p99"] <= cell["cpu"]["max"]


def test_repeated_runs_give_each_statistics_median_and_keep_each_runs_p99() -> None:
    """Three runs of a cell: the median of each statistic, every run's p99 beside it, the
    fallbacks summed; a failed run is reported, not averaged away."""
    runs = [
        {
            "p50": p50,
            "p99": p99,
            "max": mx,
            "cpu": {"p50": p50, "p99": p99, "max": mx},
            "passes": 5,
            "budget_fallbacks": 1,
        }
        for p50, p99, mx in ((0.5, 0.9, 1.0), (0.4, 2.0, 2.5), (0.6, 0.8, 0.9))
    ]
    cell = _median_run(runs)
    assert isinstance(cell, dict)
    assert (cell["p50"], cell["p99"], cell["max"]) == (0.5, 0.9, 1.0)
    assert cell["cpu"]["p99_runs"] == [0.9, 2.0, 0.8] and cell["runs"] == 3 and cell["budget_fallbacks"] == 3
    assert _median_run([*runs, "error: boom"]) == "error: boom"
    assert _median_run(runs[:1]) is runs[0]


def test_the_plan_path_repeats_every_cell() -> None:
    rows = bench_plan_path([(usual_state(40, running=8), 3)], ["fcfs", "gmax"], repeats=2)
    for cell in rows["40"].values():
        assert isinstance(cell, dict) and cell["runs"] == 2 and len(cell["cpu"]["p99_runs"]) == 2
        assert cell["cpu"]["p50"] <= cell["cpu"]["p99"] <= cell["cpu"]["max"]


def test_every_routing_policy_decides_on_a_small_pool() -> None:
    rows = bench_routing(workers=(4,), max_calls=5, max_seconds=0.05)
    assert list(rows) == [*ROUTING_POLICIES, MIGRATION_ROW]
    assert all(len(values) == 1 and values[0] > 0 for values in rows.values()), rows
