"""The multi-seed summary: statistics over seeds, ratios to the same seed's baseline, and
invalid emulated runs kept out of the means but counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.goodput.sweep import markdown, summarize, write_summary


def _run(label: str, goodput: float, late: float | None = None, rate: float = 2.0) -> dict:
    metrics = {"attainment": goodput / 10, "goodput_rps": goodput, "dslo_tok_s": 10 * goodput}
    config = {} if late is None else {"pacing": {label: {"late_share": late}}}
    return {"label": label, "rate": rate, "metrics": metrics, "config": config}


def test_ratios_use_the_same_seeds_baseline_and_invalid_runs_stay_out() -> None:
    runs = [
        (0, _run("fcfs", 1.0, 0.0)),
        (0, _run("tempo", 3.0, 0.0)),
        (1, _run("fcfs", 2.0, 0.0)),
        (1, _run("tempo", 3.0, 0.0)),
        (2, _run("fcfs", 1.0, 0.0)),
        (2, _run("tempo", 9.0, 0.05)),  # late emulation: does not count
    ]
    rows = {r["label"]: r for r in summarize(runs, "fcfs")}
    tempo = rows["tempo"]
    assert tempo["invalid"] == 1 and tempo["seeds"] == [0, 1, 2]
    assert tempo["goodput_x"] == {"mean": pytest.approx(2.25), "min": 1.5, "max": 3.0, "n": 2}
    assert tempo["worst_late_share"] == 0.05
    assert rows["fcfs"]["goodput_x"]["mean"] == pytest.approx(1.0)
    assert "1 INVALID" in markdown(list(rows.values()), "fcfs")


def test_the_summary_is_written_from_the_seed_folders(tmp_path: Path) -> None:
    for seed, (f, t) in enumerate([(1.0, 2.0), (1.0, 4.0)]):
        folder = tmp_path / f"seed-{seed}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps({"runs": [_run("fcfs", f), _run("tempo", t)]}))
    table = write_summary(tmp_path, "fcfs")
    assert "3.00 (2.00–4.00)" in table
    assert json.loads((tmp_path / "summary.json").read_text())[1]["label"] == "tempo"
