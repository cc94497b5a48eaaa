"""The files a comparison leaves behind: results.json (everything, raw records included, so a run
can be re-scored later without re-running it), results.md (the table to read) and the plots.

results.json schema (version 1):

    {
      "schema": "sglang-slo/goodput-results",
      "version": 1,
      "runs": [
        {
          "label": str,            # policy or server name, e.g. "edf", "stock", "router"
          "rate": float | null,    # offered load in requests/s; null = the trace's own rate
          "config": {...},         # free-form: what was run (model, trace, mix, flags)
          "metrics": {...},        # RunMetrics.to_dict() (benchmarks.goodput.scoring)
          "timeline": [            # scoring.timeline(): one entry per time bin
            {"t_s", "goodput_rps", "finished_rps", "throughput_tok_s", "queue"}, ...
          ],
          "records": [{...}, ...]  # RequestRecord.to_dict() of every request
        }, ...
      ]
    }

A run given to these functions is a dict of those keys; "metrics" may be a RunMetrics and
"records" RequestRecords, both are converted on writing. Numbers are plain JSON: no NaN.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

from benchmarks.goodput.emulation_validity import MAX_LATE_SHARE, invalid_note, late_cell, verdict
from benchmarks.goodput.records import RequestRecord
from benchmarks.goodput.scoring import RunMetrics, check_consistency

SCHEMA = "sglang-slo/goodput-results"
VERSION = 1
RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"


def _metrics(run: dict[str, Any]) -> dict[str, Any]:
    m = run.get("metrics") or {}
    return m.to_dict() if isinstance(m, RunMetrics) else m


def _run_json(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "label": str(run["label"]),
        "rate": run.get("rate"),
        "config": dict(run.get("config") or {}),
        "metrics": _metrics(run),
        "timeline": list(run.get("timeline") or []),
        "records": [r.to_dict() if is_dataclass(r) else dict(r) for r in run.get("records") or []],
    }


def write_results(out_dir: str | Path, runs: Sequence[dict[str, Any]], baseline_label: str | None = None) -> Path:
    """Write results.json and results.md into `out_dir` (created if missing); returns the JSON's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    body = {"schema": SCHEMA, "version": VERSION, "runs": [_run_json(r) for r in runs]}
    path = out / RESULTS_JSON
    # default=str: a config may hold Paths; allow_nan=False: a NaN would break strict JSON readers.
    path.write_text(json.dumps(body, indent=1, allow_nan=False, default=str) + "\n")
    (out / RESULTS_MD).write_text(markdown_table(runs, baseline_label) + "\n")
    return path


def read_results(path: str | Path) -> list[dict[str, Any]]:
    """The runs of a results.json, records back as RequestRecords (to re-score or re-plot)."""
    body = json.loads(Path(path).read_text())
    if body.get("schema") != SCHEMA or body.get("version") != VERSION:
        raise ValueError(f"{path}: not a {SCHEMA} v{VERSION} file")
    runs = body["runs"]
    for run in runs:
        run["records"] = [RequestRecord.from_dict(r) for r in run["records"]]
    return runs


def _num(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None or b == 0 else f"{a / b:.2f}"


def _pct(m: dict[str, Any], key: str, p: str) -> float | None:
    return (m.get(key) or {}).get(p)


COLUMNS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("requests", lambda m: str(m.get("requests", "-"))),
    ("attainment", lambda m: _num(m.get("attainment"), 3)),
    ("goodput req/s", lambda m: _num(m.get("goodput_rps"), 3)),
    ("DSLO tok/s", lambda m: _num(m.get("dslo_tok_s"), 1)),
    ("gain ratio", lambda m: _num(m.get("service_gain_ratio"), 3)),
    ("TTFT p50 ms", lambda m: _num(_pct(m, "ttft_ms", "p50"), 1)),
    ("TTFT p99 ms", lambda m: _num(_pct(m, "ttft_ms", "p99"), 1)),
    ("TPOT p50 ms", lambda m: _num(_pct(m, "tpot_ms", "p50"), 1)),
    ("host transit p90 ms", lambda m: _num(_pct(m, "host_transit_ms", "p90"), 1)),
    ("tok/s", lambda m: _num(m.get("throughput_tok_s"), 1)),
    ("lost", lambda m: str(m.get("lost", "-"))),
]


def _baseline(runs: Sequence[dict[str, Any]], label: str | None, rate: Any) -> dict[str, Any] | None:
    """The baseline's run at the same rate (a sweep compares like with like), else its first run."""
    if not runs:
        return None
    label = runs[0]["label"] if label is None else label
    mine = [r for r in runs if r["label"] == label]
    return next((r for r in mine if r.get("rate") == rate), mine[0] if mine else None)


def markdown_table(runs: Sequence[dict[str, Any]], baseline_label: str | None = None) -> str:
    """One row per run; "goodput ×" and "DSLO ×" divide by the baseline label's run at the same
    rate (default baseline: the first run's label)."""
    head = ["label", "rate", *(name for name, _ in COLUMNS), "goodput ×", "DSLO ×"]
    emulated = any((run.get("config") or {}).get("pacing") for run in runs)
    if emulated:  # every run on emulated workers shows whether the emulation kept pace
        head.append("late steps (worst worker)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        m = _metrics(run)
        base = _baseline(runs, baseline_label, run.get("rate"))
        bm = _metrics(base) if base is not None else {}
        cells = [str(run["label"]), _num(run.get("rate"), 2), *(cell(m) for _, cell in COLUMNS)]
        cells += [
            _ratio(m.get("goodput_rps"), bm.get("goodput_rps")),
            _ratio(m.get("dslo_tok_s"), bm.get("dslo_tok_s")),
        ]
        if emulated:
            cells.append(late_cell((run.get("config") or {}).get("pacing")))
        lines.append("| " + " | ".join(cells) + " |")
    note = invalid_note(list(runs))
    return "\n".join(lines) + (f"\n\n{note}" if note else "")


def _rate_key(run: dict[str, Any]) -> float:
    rate = run.get("rate")
    return float("-inf") if rate is None else float(rate)


def plot(out_dir: str | Path, runs: Sequence[dict[str, Any]]) -> list[Path]:
    """goodput_vs_rate.png (only when some label was run at several rates) and over_time.png
    (goodput and queue length per time bin, each label at its highest rate); returns the paths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # a plotting dependency only here
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_label.setdefault(str(run["label"]), []).append(run)
    written: list[Path] = []

    swept = {k: sorted((r for r in v if r.get("rate") is not None), key=_rate_key) for k, v in by_label.items()}
    if any(len({r["rate"] for r in v}) > 1 for v in swept.values()):
        fig = Figure(figsize=(6, 4))
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        for label, rs in swept.items():
            ys = [_metrics(r).get("goodput_rps") for r in rs]
            ax.plot([r["rate"] for r in rs], [float("nan") if y is None else y for y in ys], marker="o", label=label)
        ax.set(xlabel="offered load (req/s)", ylabel="goodput (attained req/s)", title="Goodput vs load")
        ax.grid(alpha=0.3)
        ax.legend()
        written.append(save_figure(fig, out / "goodput_vs_rate.png"))

    last = {k: max(v, key=_rate_key) for k, v in by_label.items()}
    if any(r.get("timeline") for r in last.values()):
        fig = Figure(figsize=(7, 6))
        FigureCanvasAgg(fig)
        top, bottom = fig.subplots(2, 1, sharex=True)
        for label, run in last.items():
            tl = run.get("timeline") or []
            rate = run.get("rate")
            name = label if rate is None else f"{label} @ {rate:g} req/s"
            top.plot([b["t_s"] for b in tl], [b["goodput_rps"] for b in tl], marker=".", label=name)
            bottom.plot([b["t_s"] for b in tl], [b["queue"] for b in tl], marker=".", label=name)
        top.set(ylabel="goodput (attained req/s)", title="Over time")
        bottom.set(xlabel="time since run start (s)", ylabel="in flight (requests)")
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend()
        written.append(save_figure(fig, out / "over_time.png"))
    return written


def save_figure(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def describe(run: dict[str, Any]) -> str:
    m = run["metrics"]
    bad = check_consistency(m)
    line = (
        f"   {run['label']} @ {run['rate']}/s: {m.requests} requests, attained {m.attainment:.0%}, "
        f"goodput {m.goodput_rps or 0:.2f} req/s, {m.throughput_tok_s or 0:.1f} tok/s, "
        f"lost {m.lost}, cut {m.cut}, never sent {m.never_sent}"
    )
    pacing = verdict(run["config"].get("pacing"))
    if pacing["valid"] is False:
        line += f"\n   INVALID: emulated steps late on {', '.join(pacing['late_workers'])} (> {MAX_LATE_SHARE:.0%})"
    return line + (f"\n   INCONSISTENT: {bad}" if bad else "")
