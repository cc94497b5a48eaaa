"""A run on emulated workers counts only when every worker kept its card's pace; the tables say
so, and the pacing check over batch shapes reports each cell from the worker's own counters."""

from __future__ import annotations

from benchmarks.emulation_shapes import cell_result, table
from benchmarks.goodput.emulation_validity import MAX_LATE_SHARE, invalid_note, late_cell, pacing_delta, verdict
from benchmarks.goodput.report import markdown_table


def _pacing(**shares: float) -> dict[str, dict[str, float]]:
    return {name: {"late_share": share} for name, share in shares.items()}


def test_a_run_is_invalid_when_any_worker_ran_more_than_two_percent_late() -> None:
    assert MAX_LATE_SHARE == 0.02
    ok = verdict(_pacing(h100=0.004, a40=0.02))
    assert ok == {"valid": True, "worst_late_share": 0.02, "late_workers": []}
    bad = verdict({**_pacing(h100=0.004, a40=0.031), "a40-3": None})
    assert bad["valid"] is False and bad["late_workers"] == ["a40"] and bad["worst_late_share"] == 0.031
    assert verdict({"tiny-0": None})["valid"] is None and verdict(None)["valid"] is None  # nothing emulated
    assert late_cell(_pacing(w=0.004)) == "0.4%"
    assert late_cell(_pacing(w=0.031)) == "3.1% INVALID"
    assert late_cell(None) == "-"


def test_results_tables_flag_invalid_runs_and_leave_unemulated_ones_alone() -> None:
    metrics = {"requests": 10, "attainment": 0.9, "goodput_rps": 1.0}
    plain = [{"label": "edf", "rate": 1.0, "metrics": metrics, "config": {}}]
    assert "late steps" not in markdown_table(plain)
    runs = [
        {"label": "edf", "rate": 1.0, "metrics": metrics, "config": {"pacing": _pacing(edf=0.001)}},
        {"label": "gmax", "rate": 1.0, "metrics": metrics, "config": {"pacing": _pacing(gmax=0.05)}},
    ]
    text = markdown_table(runs)
    assert "late steps (worst worker)" in text and "| 0.1% |" in text and "| 5.0% INVALID |" in text
    assert "INVALID (" in text and "gmax @ 1.0" in text and "edf @" not in invalid_note(runs)


def test_a_runs_pacing_is_the_difference_of_two_reads() -> None:
    before = {"steps": 100, "late_steps": 1, "unpaced_steps": 0}
    after = {"steps": 300, "late_steps": 5, "unpaced_steps": 0, "gpu_model": "h100/llama3-8b"}
    assert pacing_delta(before, after)["late_share"] == 0.02


def test_a_shape_cell_is_taken_from_the_workers_counters() -> None:
    before = {
        "steps": 100, "unpaced_steps": 0, "late_steps": 2, "mean_overrun_ms": 10.0, "mean_overrun_share": 0.1,
        "host_gap_s": 1.0, "back_to_back_s": 9.0,
    }  # fmt: skip
    after = {
        "steps": 300, "unpaced_steps": 0, "late_steps": 3, "mean_overrun_ms": 10.0, "mean_overrun_share": 0.1,
        "host_gap_s": 1.5, "back_to_back_s": 18.5,
    }  # fmt: skip
    row = cell_result(before, after)
    assert row["steps"] == 200 and row["late_steps"] == 1 and row["late_share"] == 0.005
    assert abs(row["mean_overrun_ms"] - 10.0) < 1e-9 and abs(row["host_gap_share"] - 0.05) < 1e-9
    assert row["on_time"] is False  # 10 % overrun per late step is over the 5 % target
    assert not cell_result(after, after)["late_steps"] and cell_result(after, after)["on_time"]
    rows = [{"gpu": "h100", "batching": "mixed", "chunk": 8192, "running": 256, **row}]
    assert "| h100 | mixed | 8192 | 256 | 200 | 0.50 % | 10.0 ms | 10.0 % | 5.0 % | NO |" in table(rows)
