"""The GPU smoke command's own parts (the GPU run itself needs a GPU): its --help, the table it
prints, and how it reads sglang.bench_serving's results."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from benchmarks.experiments.gpu_smoke import CHECKS, Check, bench_result, build_parser, render, within

ROOT = Path(__file__).resolve().parents[3]


def test_the_help_documents_every_check_without_a_set_up() -> None:
    done = subprocess.run(
        [str(ROOT / "benchmarks" / "experiments" / "gpu_smoke.sh"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    for name in CHECKS:
        assert name in done.stdout
    assert "98 %" in done.stdout and "20 %" in done.stdout and "--allow-cpu" in done.stdout


def test_the_table_has_a_row_per_check_and_says_pass_or_fail() -> None:
    table = render([Check("driver", True, "NVIDIA H100, 550.54", "nvidia-smi"), Check("router", False, "3/4", "all")])
    lines = table.splitlines()
    assert lines[0].startswith("| check") and set(lines[1]) <= {"|", "-"}
    assert "| driver " in lines[2] and "PASS" in lines[2] and "FAIL" in lines[3]
    assert len({len(line) for line in lines}) == 1  # aligned columns


def test_predictions_within_tolerance() -> None:
    assert within(10.0, 11.9, 0.2) and within(10.0, 8.1, 0.2)
    assert not within(10.0, 12.5, 0.2) and not within(0.0, 1.0, 0.2)


def test_the_last_bench_serving_result_is_read() -> None:
    first = json.dumps({"completed": 1, "output_throughput": 5.0})
    last = json.dumps({"completed": 256, "output_throughput": 1234.5, "mean_tpot_ms": 3.2})
    assert bench_result(f"{first}\n{last}\n")["output_throughput"] == 1234.5
    with pytest.raises(ValueError, match="no result"):
        bench_result("\n")


def test_checks_can_be_skipped_by_name() -> None:
    args = build_parser().parse_args(["--skip", "failover", "--skip", "emulation", "--allow-cpu"])
    assert args.skip == ["failover", "emulation"] and args.allow_cpu
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--skip", "nope"])
