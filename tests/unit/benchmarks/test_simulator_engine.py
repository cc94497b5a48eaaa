"""benchmarks.simulator.engine's summary: ratios per seed against fcfs and against the best
ordering baseline of the same seed (a short real-trace run on the simulator)."""

from __future__ import annotations

import json

import pytest

from benchmarks.simulator.engine import main


def test_slo_policies_are_compared_with_the_best_ordering_baseline_of_each_seed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--gpu", "a100", "--mix", "slos-coder", "--units", "40", "--rates", "10", "--seeds", "0"]
    assert main([*argv, "--policies", "fcfs,edf,sarathi,slos", "--json"]) == 0
    rows = {r["policy"]: r for r in json.loads(capsys.readouterr().out)}
    best = max(rows["edf"]["goodput_rps"], rows["sarathi"]["goodput_rps"])
    assert best > 0
    assert rows["slos"]["x_best_ordering"] == pytest.approx(rows["slos"]["goodput_rps"] / best)
    assert rows["slos"]["x_fcfs"] == pytest.approx(rows["slos"]["goodput_rps"] / rows["fcfs"]["goodput_rps"])
    assert rows["edf"]["x_best_ordering"] is None and rows["fcfs"]["x_best_ordering"] is None
