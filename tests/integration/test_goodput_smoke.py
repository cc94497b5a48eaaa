"""The goodput benchmark end to end: real servers (stock SGLang and ours, tiny model), a real
trace slice with the tempo mix, calibration, open-loop load with compound programs, and the
report files. Checks that the files exist and that their numbers are consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.goodput.compare import main
from benchmarks.goodput.report import read_results
from benchmarks.workloads.traces import available_traces

pytestmark = pytest.mark.skipif(
    "azure-conv" not in available_traces(), reason="needs ../shared/data (the public traces)"
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_short_comparison_writes_consistent_reports(tmp_path: Path) -> None:
    out = tmp_path / "goodput"
    rc = main(
        [
            "--stock",
            "--policies", "edf",
            "--model-path", "tiny",
            "--trace", "azure-conv",
            "--mix", "tempo",
            "--slo-scale", "auto",
            "--units", "10",
            "--rates", "3,6",
            "--max-prompt", "64",
            "--max-output", "12",
            "--drain-timeout", "90",
            "--bin-s", "1",
            "--quiet",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert rc == 0  # nothing lost, every run's numbers consistent
    assert {p.name for p in out.iterdir()} >= {"results.json", "results.md", "goodput_vs_rate.png", "over_time.png"}
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == PNG_MAGIC

    runs = read_results(out / "results.json")
    assert [(r["label"], r["rate"]) for r in runs] == [("stock", 3.0), ("stock", 6.0), ("edf", 3.0), ("edf", 6.0)]
    raw = json.loads((out / "results.json").read_text())
    assert raw["runs"][0]["config"]["calibration"]["tpot_ms"] > 0
    for run in runs:
        m, records = run["metrics"], run["records"]
        assert m["requests"] == len(records) >= 10  # compound units are several requests
        assert m["lost"] == 0 and m["never_sent"] == 0 and m["cut"] == 0
        assert m["finished"] + m["dropped"] + m["lost"] + m["cut"] + m["never_sent"] == m["requests"]
        assert 0.0 <= m["attainment"] <= 1.0
        assert m["goodput_rps"] <= m["finished_rps"] + 1e-9
        assert m["dslo_tokens"] <= m["output_tokens"] == sum(len(r.token_s) for r in records)
        assert all(r.output_tokens == r.target_output_tokens for r in records)  # the length control held
        assert any(r.cls == "compound" for r in records)
        stages = [r for r in records if r.program_id]
        assert all(r.program_start_s is not None and r.send_s >= r.program_start_s for r in stages)
    stock_records = runs[0]["records"]
    ours_records = runs[2]["records"]
    assert raw["runs"][0]["config"]["length_control"] == "client"  # one mechanism for both servers
    assert all(r.finish_reason == "client_stop" for r in stock_records + ours_records)
    assert [r["config"]["send_slo"] for r in raw["runs"]] == [False, False, True, True]  # stock gets no SLO field
    # the same planned workload went to both servers
    assert [(r.key, r.prompt_tokens, r.slo) for r in stock_records] == [
        (r.key, r.prompt_tokens, r.slo) for r in ours_records
    ]
    table = (out / "results.md").read_text()
    assert table.count("| stock |") == 2 and table.count("| edf |") == 2
