"""Goodput × fcfs against load, one panel per mix, from `benchmarks.simulator.engine --json` files.

The sustained-overload matrix runs one (mix, rate) per process so that several share a host;
this draws the points back together, each policy's seed range as an error bar.

    python -m benchmarks.experiments.gain_plot --out gain.png \\
        tempo=runs/tempo-10.json,runs/tempo-45.json jitserve=runs/jit-10.json,...
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.goodput.report import save_figure

# (rate, mean, min, max) of goodput × fcfs, one per rate, sorted by rate
Series = list[tuple[float, float, float, float]]


def gain_series(rows: Iterable[dict[str, Any]]) -> dict[str, Series]:
    """Each policy's points across the files' rows; a later row for the same rate replaces an earlier one."""
    points: dict[str, dict[float, tuple[float, float, float, float]]] = {}
    for row in rows:
        rate = float(row["rate"])
        points.setdefault(str(row["policy"]), {})[rate] = (
            rate,
            float(row["x_fcfs"]),
            float(row["x_fcfs_min"]),
            float(row["x_fcfs_max"]),
        )
    return {policy: sorted(by_rate.values()) for policy, by_rate in points.items()}


def read_rows(paths: Sequence[str | Path]) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in paths:
        rows.extend(json.loads(Path(path).read_text()))
    return rows


def plot_gain(panels: dict[str, dict[str, Series]], out: str | Path, title: str = "") -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # a plotting dependency only here
    from matplotlib.figure import Figure
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    fig = Figure(figsize=(4.2 * len(panels), 3.8))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (mix, series) in zip(axes, panels.items(), strict=True):
        for policy, pts in sorted(series.items()):
            rates = [p[0] for p in pts]
            means = [p[1] for p in pts]
            below = [p[1] - p[2] for p in pts]
            above = [p[3] - p[1] for p in pts]
            style = "--" if policy.endswith("_oracle") else "-"
            ax.errorbar(rates, means, yerr=[below, above], marker="o", ms=3, ls=style, capsize=2, label=policy)
        ax.set(xlabel="arrival rate (units/s)", ylabel="goodput × fcfs", title=mix, yscale="log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3, which="both")
    axes[0].legend(fontsize=7)
    if title:
        fig.suptitle(title)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the PNG to write")
    ap.add_argument("--title", default="")
    ap.add_argument("panels", nargs="+", metavar="MIX=FILE[,FILE...]")
    args = ap.parse_args(argv)
    panels: dict[str, dict[str, Series]] = {}
    for spec in args.panels:
        mix, sep, files = spec.partition("=")
        if not sep or not files:
            ap.error(f"panels: expected MIX=FILE[,FILE...], got {spec!r}")
        panels[mix] = gain_series(read_rows([f for f in files.split(",") if f]))
    print(plot_gain(panels, args.out, args.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
