"""benchmarks.goodput.report: results.json round-trips to RequestRecords, the markdown table has
one row per run with ratios against the baseline at the same rate, and the plots are real PNGs."""

from __future__ import annotations

import json

import pytest

from benchmarks.goodput.records import RequestRecord
from benchmarks.goodput.report import markdown_table, plot, read_results, write_results
from benchmarks.goodput.scoring import score, timeline

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def records(n: int, late_every: int = 0) -> list[RequestRecord]:
    """n deadline requests, one per 0.5 s, each 0.3 s long; every `late_every`-th misses its deadline."""
    out = []
    for i in range(n):
        send = 0.5 * i
        deadline = 100 if late_every and i % late_every == 0 else 1000
        out.append(
            RequestRecord(
                key=f"r{i}",
                cls="deadline",
                slo={"class": "deadline", "deadline_ms": deadline},
                prompt_tokens=8,
                target_output_tokens=2,
                scheduled_s=send,
                send_s=send,
                token_s=[send + 0.1, send + 0.3],
                finish_s=send + 0.3,
                finish_reason="length",
                tier="admitted",
            )  # fmt: skip
        )
    return out


def run(label: str, rate: float | None, recs: list[RequestRecord]) -> dict:
    return {
        "label": label,
        "rate": rate,
        "config": {"trace": "hand", "n": len(recs)},
        "metrics": score(recs),
        "timeline": timeline(recs, 1.0),
        "records": recs,
    }


def fake(label: str, rate: float, goodput: float, dslo: float) -> dict:
    return {"label": label, "rate": rate, "metrics": {"goodput_rps": goodput, "dslo_tok_s": dslo, "lost": 0}}


def test_results_json_round_trips(tmp_path):
    runs = [run("stock", 2.0, records(6, late_every=2)), run("edf", 2.0, records(6))]
    path = write_results(tmp_path / "out", runs, baseline_label="stock")
    assert path == tmp_path / "out" / "results.json"
    body = json.loads(path.read_text())
    assert body["schema"] == "sglang-slo/goodput-results" and body["version"] == 1
    assert [r["label"] for r in body["runs"]] == ["stock", "edf"]
    assert body["runs"][1]["metrics"]["attainment"] == 1.0
    back = read_results(path)
    assert back[0]["records"] == runs[0]["records"]
    assert isinstance(back[1]["records"][0], RequestRecord)
    assert back[0]["metrics"] == runs[0]["metrics"].to_dict()
    assert back[0]["timeline"] == runs[0]["timeline"] and back[0]["config"] == {"trace": "hand", "n": 6}
    assert score(back[0]["records"]).to_dict() == back[0]["metrics"]  # re-scoring from the file agrees
    md = (tmp_path / "out" / "results.md").read_text()
    assert md.strip() == markdown_table(runs, "stock")


def test_read_results_rejects_other_files(tmp_path):
    (tmp_path / "x.json").write_text('{"runs": []}')
    with pytest.raises(ValueError):
        read_results(tmp_path / "x.json")


def test_markdown_one_row_per_run_with_baseline_ratios():
    runs = [fake("stock", 1.0, 2.0, 100.0), fake("edf", 1.0, 3.0, 250.0), fake("stock", 2.0, 1.0, 50.0),
            fake("edf", 2.0, 4.0, 0.0)]  # fmt: skip
    lines = markdown_table(runs, baseline_label="stock").splitlines()
    header, rows = lines[0], lines[2:]
    assert len(rows) == len(runs)
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert cols[-2:] == ["goodput ×", "DSLO ×"]
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in rows]
    assert [(c[0], c[1], c[-2], c[-1]) for c in cells] == [
        ("stock", "1.00", "1.00", "1.00"),
        ("edf", "1.00", "1.50", "2.50"),  # vs stock at the same rate 1.0
        ("stock", "2.00", "1.00", "1.00"),
        ("edf", "2.00", "4.00", "0.00"),  # vs stock at rate 2.0
    ]
    assert markdown_table(runs, baseline_label="absent").splitlines()[2].endswith("| - | - |")
    assert markdown_table(runs).splitlines()[3] == lines[3]  # default baseline: the first run's label


def test_plots_are_png_files(tmp_path):
    runs = [run(lbl, rate, records(int(4 * rate), late_every=3)) for lbl in ("stock", "edf") for rate in (1.0, 2.0)]
    paths = plot(tmp_path, runs)
    assert [p.name for p in paths] == ["goodput_vs_rate.png", "over_time.png"]
    for p in paths:
        assert p.parent == tmp_path and p.read_bytes()[:8] == PNG_SIGNATURE


def test_single_rate_plots_only_over_time(tmp_path):
    paths = plot(tmp_path, [run("stock", 2.0, records(4)), run("edf", None, records(4))])
    assert [p.name for p in paths] == ["over_time.png"]
    assert paths[0].read_bytes()[:8] == PNG_SIGNATURE
