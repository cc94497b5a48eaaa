"""The gain plot gathers one policy's points from several per-rate files, in rate order."""

import json
from pathlib import Path

import pytest

from benchmarks.experiments.gain_plot import gain_series, main


def _row(rate: float, policy: str, x: float) -> dict[str, object]:
    return {"rate": rate, "policy": policy, "x_fcfs": x, "x_fcfs_min": x - 0.1, "x_fcfs_max": x + 0.2}


def test_points_from_several_files_are_joined_per_policy_in_rate_order() -> None:
    series = gain_series([_row(45, "tempo", 2.1), _row(10, "tempo", 1.0), _row(10, "fcfs", 1.0)])
    assert series["tempo"] == [pytest.approx((10.0, 1.0, 0.9, 1.2)), pytest.approx((45.0, 2.1, 2.0, 2.3))]
    assert [p[0] for p in series["fcfs"]] == [10.0]


def test_a_later_row_for_the_same_rate_replaces_the_earlier_one() -> None:
    assert gain_series([_row(30, "slos", 1.5), _row(30, "slos", 1.8)])["slos"] == [pytest.approx((30.0, 1.8, 1.7, 2.0))]


def test_the_command_writes_one_png_with_a_panel_per_mix(tmp_path: Path) -> None:
    files = []
    for rate, x in ((10, 1.0), (30, 1.9)):
        f = tmp_path / f"tempo-{rate}.json"
        f.write_text(json.dumps([_row(rate, "fcfs", 1.0), _row(rate, "tempo", x)]))
        files.append(str(f))
    out = tmp_path / "fig" / "gain.png"
    assert main(["--out", str(out), f"tempo={','.join(files)}", f"coder={files[0]}"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
