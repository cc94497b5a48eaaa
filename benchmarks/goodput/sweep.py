"""Several seeds of one goodput comparison, and the table that ranks policies across them.

Each seed is a full `python -m benchmarks.goodput` run (the same targets, rates and flags; only
`--seed` differs, which redraws the arrivals, the lengths' order and the SLO mix) written to
OUT/seed-S. The summary gives, per rate and target, the mean and the range over seeds of
attainment, goodput and DSLO token goodput, each goodput also as a ratio to the baseline target
of the same seed (ratios, since these machines are noisy), plus the worst emulated worker's late
share: a cell with an invalid run (late share above 2 %) is marked and kept out of the means.

  .venv/bin/python -m benchmarks.goodput.sweep --seeds 0,1,2 --baseline fcfs -- \\
      --policies fcfs,edf,tempo --model-path tiny --server-arg=--emulate-gpu=h100 ... --out results/x
  .venv/bin/python -m benchmarks.goodput.sweep --summarize results/x      # re-read finished seeds
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.goodput import compare
from benchmarks.goodput.emulation_validity import verdict

SUMMARY_JSON = "summary.json"
SUMMARY_MD = "summary.md"


def _runs(out: Path) -> list[tuple[int, dict[str, Any]]]:
    """(seed, run) for every finished run under OUT/seed-*."""
    found = []
    for path in sorted(out.glob("seed-*/results.json")):
        seed = int(path.parent.name.split("-", 1)[1])
        found += [(seed, run) for run in json.loads(path.read_text()).get("runs", [])]
    return found


def _stats(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values)}


def summarize(runs: Iterable[tuple[int, dict[str, Any]]], baseline: str) -> list[dict[str, Any]]:
    """One row per (rate, label): stats over seeds; ratios to `baseline` of the same seed and rate."""
    by_cell: dict[tuple[float, str], dict[int, dict[str, Any]]] = {}
    for seed, run in runs:
        by_cell.setdefault((run.get("rate") or 0.0, run["label"]), {})[seed] = run
    rows = []
    for (rate, label), seeds in sorted(by_cell.items()):
        base = by_cell.get((rate, baseline), {})
        valid = {s: r for s, r in seeds.items() if verdict((r.get("config") or {}).get("pacing"))["valid"] is not False}
        late = [verdict((r.get("config") or {}).get("pacing")).get("worst_late_share") for r in seeds.values()]
        cell: dict[str, Any] = {
            "rate": rate,
            "label": label,
            "seeds": sorted(seeds),
            "invalid": len(seeds) - len(valid),
        }
        for key in ("attainment", "goodput_rps", "dslo_tok_s", "service_gain_ratio", "throughput_tok_s"):
            cell[key] = _stats([r["metrics"].get(key) or 0.0 for r in valid.values()])
        for key, out in (("goodput_rps", "goodput_x"), ("dslo_tok_s", "dslo_x")):
            ratios = [
                (r["metrics"].get(key) or 0.0) / b
                for s, r in valid.items()
                if s in base and (b := base[s]["metrics"].get(key) or 0.0) > 0
            ]
            cell[out] = _stats(ratios)
        numeric = [x for x in late if isinstance(x, int | float)]
        cell["worst_late_share"] = max(numeric) if numeric else None
        rows.append(cell)
    return rows


def _fmt(stat: dict[str, float] | None, digits: int = 2) -> str:
    if stat is None:
        return "-"
    return f"{stat['mean']:.{digits}f} ({stat['min']:.{digits}f}–{stat['max']:.{digits}f})"


def markdown(rows: Sequence[dict[str, Any]], baseline: str) -> str:
    head = [
        "rate",
        "policy",
        "attainment",
        "goodput req/s",
        f"goodput × {baseline}",
        f"DSLO × {baseline}",
        "gain ratio",
        "tok/s",
        "late steps (worst)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        late = "-" if r["worst_late_share"] is None else f"{100 * r['worst_late_share']:.2f} %"
        if r["invalid"]:
            late += f" ({r['invalid']} INVALID)"
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{r['rate']:g}",
                    r["label"],
                    _fmt(r["attainment"]),
                    _fmt(r["goodput_rps"]),
                    _fmt(r["goodput_x"]),
                    _fmt(r["dslo_x"]),
                    _fmt(r["service_gain_ratio"]),
                    _fmt(r["throughput_tok_s"], 0),
                    late,
                ]
            )
            + " |"
        )
    return "\n".join(lines) + "\n\nmean (min–max) over seeds; ratios against the baseline of the same seed and rate."


def write_summary(out: Path, baseline: str) -> str:
    rows = summarize(_runs(out), baseline)
    (out / SUMMARY_JSON).write_text(json.dumps(rows, indent=1) + "\n")
    table = markdown(rows, baseline)
    (out / SUMMARY_MD).write_text(table + "\n")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--baseline", default="fcfs", help="the label ratios divide by (default fcfs)")
    p.add_argument("--summarize", type=Path, help="only re-read OUT/seed-* and write the summary")
    args = p.parse_args(argv)
    if args.summarize is not None:
        print(write_summary(args.summarize, args.baseline))
        return 0
    base = compare.parse_args(passthrough)
    out = base.out
    status = 0
    calibrated: Path | None = base.calibration_from
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        print(f"=== seed {seed}", flush=True)
        seed_out = out / f"seed-{seed}"
        extra = ["--seed", str(seed), "--out", str(seed_out)]
        if calibrated is not None and base.calibration_from is None:
            extra += ["--calibration-from", str(calibrated)]  # every seed gets the same SLOs
        status |= compare.main([*passthrough, *extra])
        if calibrated is None and not base.no_calibration and (seed_out / "results.json").is_file():
            calibrated = seed_out / "results.json"
    print(write_summary(out, args.baseline))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
