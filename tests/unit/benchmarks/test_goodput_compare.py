"""The comparison CLI's own decisions: which length control a server gets, reused calibrations,
argument checks. (The end-to-end run is tests/integration/test_goodput_smoke.py.)"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.goodput.compare import earlier_calibration, parse_args, targets_of
from benchmarks.goodput.harness import load_options, uniform_length_control
from benchmarks.goodput.loadgen import LengthControl
from benchmarks.goodput.scoring import auto_bin_s


def test_every_target_of_a_run_gets_the_same_length_control() -> None:
    ours_only = parse_args(["--policies", "fcfs,edf"])
    assert uniform_length_control("auto", targets_of(ours_only)) is LengthControl.HINT
    with_stock = parse_args(["--stock", "--policies", "edf"])
    assert uniform_length_control("auto", targets_of(with_stock)) is LengthControl.CLIENT
    assert uniform_length_control("max-tokens", targets_of(ours_only)) is LengthControl.MAX_TOKENS
    args = parse_args([])
    args.control = LengthControl.CLIENT
    assert load_options(args, ours=True).send_slo and not load_options(args, ours=False).send_slo
    assert load_options(args, ours=True).length_control is LengthControl.CLIENT


def test_a_repeat_reuses_the_stored_calibration(tmp_path: Path) -> None:
    stored = {"ttft_base_ms": 270.0, "ttft_per_token_ms": 0.3, "tpot_ms": 83.0}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"runs": [{"label": "stock", "config": {"calibration": stored}}]}))
    cal = earlier_calibration(path)
    assert (cal.ttft_base_ms, cal.ttft_per_token_ms, cal.tpot_ms) == (270.0, 0.3, 83.0)
    path.write_text(json.dumps({"runs": [{"label": "stock", "config": {"calibration": None}}]}))
    with pytest.raises(SystemExit, match="no calibration"):
        earlier_calibration(path)


def test_targets_and_rates_are_parsed_in_order() -> None:
    args = parse_args(["--stock", "--policies", "fcfs, edf", "--url", "router=http://127.0.0.1:9/", "--rates", "1,2.5"])
    assert [t.label for t in targets_of(args)] == ["stock", "fcfs", "edf", "router"]
    assert targets_of(args)[-1].url == "http://127.0.0.1:9"
    assert args.rate_list == [1.0, 2.5]
    assert parse_args([]).rate_list == [None]  # the trace's own timing


def test_a_url_without_a_label_is_refused() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--url", "http://127.0.0.1:9"])


@pytest.mark.parametrize("duration, expected", [(None, 0.25), (3.0, 0.25), (300.0, 10.0)])
def test_about_thirty_time_bins_per_run(duration: float | None, expected: float) -> None:
    assert auto_bin_s(duration) == expected


def test_sigterm_stops_a_parallel_groups_load_at_once() -> None:
    """A load that would stream for hours ends on SIGTERM with the handler's exit status (a load
    in worker threads kept the harness, and so its servers, alive until the drain ended)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.benchmarks.sigterm_child"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "LOADING"
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
