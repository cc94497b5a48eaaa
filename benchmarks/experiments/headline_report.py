"""What a headline experiment hands back, and how it is written: one row per claim (the paper's
figure, ours, their ratio, why they differ), the markdown table of rows, and the formats the rows'
numbers share."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One claim: the paper's number, ours (mean over seeds, range in `ours_text`), their ratio."""

    paper: str
    claim: str
    paper_value: str
    ours_text: str
    ratio: str
    why: str


@dataclass
class Experiment:
    """One experiment's rows, the numbers behind them (written to its JSON) and its run time."""

    rows: list[Row] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0


def value_range(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """One value, or the min–max of the finite ones; "-" when none is."""
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return "-"
    if len(values) == 1 or min(values) == max(values):
        return fmt.format(values[0])
    return f"{fmt.format(min(values))}–{fmt.format(max(values))}"


def best_of(per_load: dict[float, float]) -> str:
    """The largest ratio over the loads, and each load's."""
    each = ", ".join(f"{r:g}/s {v:.2f}" for r, v in per_load.items())
    return f"{max(per_load.values()):.2f}× (per load: {each})"


def ratio_text(ours: float | None, paper: float) -> str:
    """Ours over the paper's, or "-" when either is missing."""
    return "-" if ours is None or not paper else f"{ours / paper:.2f}"


def geomean(values: Sequence[float]) -> float:
    """Over the positive values only (a scenario with no capacity has no ratio to average)."""
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else 0.0


def table(rows: Sequence[Row]) -> str:
    """The rows as the markdown table RESULTS.md quotes."""
    lines = [
        "| paper | claim | paper's figure | ours (simulated) | ours / paper | why they differ |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {r.paper} | {r.claim} | {r.paper_value} | {r.ours_text} | {r.ratio} | {r.why} |" for r in rows]
    return "\n".join(lines)
