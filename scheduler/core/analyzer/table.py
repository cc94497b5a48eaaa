"""A trained length bound a server has from its first request: answer-length quantiles per
prompt-length bin, learned offline from a public trace and stored as a small JSON table.

A text-blind server knows a request's prompt length at arrival, and in chat traces the answer's
distribution moves with it (a whole band of prompt lengths can have a 90th percentile three times
the rest's). The recent-answers default cannot see that and knows nothing until answers are in.
The table holds, per bin of log2(prompt length), the answer length at a grid of levels (an
inverse CDF), so any quantile can be asked, and once g tokens exist the bound is the conditional
quantile among answers longer than g: F^-1(F(g) + q (1 - F(g))). Plain Python + numpy: no model
runtime. `trained.py` wraps it with the server's own history for traffic unlike the training trace.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.core.analyzer.base import LengthPredictor, LengthSample

TABLE_FORMAT = "sglang-slo/length-table/1"
BINS_PER_OCTAVE = 8  # log2(prompt) bins: an eighth of an octave (merged where rows are few)
LEVELS = 51  # the inverse CDF at levels 0, 0.02, ..., 1


def _log_len(prompt_len: int) -> float:
    return math.log2(max(int(prompt_len), 1))


@dataclass(frozen=True)
class LengthTable:
    """`lower[i]`: the smallest log2(prompt length) of bin i (bin 0 also takes anything below);
    `values[i][k]`: the answer length at level k / (LEVELS - 1) among the bin's training rows."""

    lower: tuple[float, ...]
    values: tuple[tuple[float, ...], ...]
    meta: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.lower or len(self.lower) != len(self.values):
            raise ValueError("a length table needs one row of values per bin, and at least one bin")
        if any(b <= a for a, b in zip(self.lower, self.lower[1:])):
            raise ValueError("bin lower edges must increase")
        for row in self.values:
            if len(row) < 2 or any(b < a for a, b in zip(row, row[1:])):
                raise ValueError("each bin's values must be a non-decreasing inverse CDF of >= 2 levels")

    def row(self, prompt_len: int) -> tuple[float, ...]:
        i = max(bisect.bisect_right(self.lower, _log_len(prompt_len)) - 1, 0)
        return self.values[i]

    def quantile(self, prompt_len: int, q: float, generated: int = 0) -> float:
        """The q-quantile of the answer length for this prompt length, among answers longer
        than `generated` (the table's own answers when none is: its largest)."""
        row = self.row(prompt_len)
        levels = np.linspace(0.0, 1.0, len(row))
        if generated > 0:
            if generated >= row[-1]:
                return float(max(row[-1], generated + 1))
            below = float(np.interp(generated, row, levels, left=0.0, right=1.0))  # F(g)
            q = below + q * (1.0 - below)
        return float(np.interp(q, levels, row))

    def level(self, prompt_len: int, output_len: int) -> float:
        """F(output_len): where an answer falls in its bin's distribution (0..1)."""
        row = self.row(prompt_len)
        return float(np.interp(output_len, row, np.linspace(0.0, 1.0, len(row)), left=0.0, right=1.0))

    def to_json(self) -> dict[str, Any]:
        return {
            "format": TABLE_FORMAT,
            "meta": self.meta,
            "bins_log2_prompt_lower": [round(x, 6) for x in self.lower],
            "levels": len(self.values[0]),
            "values": [[round(v, 2) for v in row] for row in self.values],
        }

    @classmethod
    def from_json(cls, blob: dict[str, Any]) -> LengthTable:
        if blob.get("format") != TABLE_FORMAT:
            raise ValueError(f"not a length table of format {TABLE_FORMAT!r}")
        values = tuple(tuple(float(v) for v in row) for row in blob["values"])
        return cls(tuple(float(x) for x in blob["bins_log2_prompt_lower"]), values, dict(blob.get("meta") or {}))

    def save(self, path: str | Path) -> None:
        """One bin per line, so a retrained table diffs bin by bin."""
        blob = self.to_json()
        rows = blob.pop("values")
        head = json.dumps(blob, indent=1)[:-2]  # without the closing brace
        body = ",\n  ".join(json.dumps(row) for row in rows)
        Path(path).write_text(f'{head},\n "values": [\n  {body}\n ]\n}}\n')

    @classmethod
    def load(cls, path: str | Path) -> LengthTable:
        return cls.from_json(json.loads(Path(path).read_text()))


def fit_table(
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    min_rows: int = 100,
    bins_per_octave: int = BINS_PER_OCTAVE,
    levels: int = LEVELS,
    meta: dict[str, Any] | None = None,
) -> LengthTable:
    """Bins of 1/bins_per_octave octave of prompt length, merged left to right until each holds
    `min_rows` rows (the last short run joins the bin before it), each stored as its inverse CDF."""
    p = np.asarray(prompt_lens, dtype=float)
    o = np.asarray(output_lens, dtype=float)
    if len(p) != len(o) or len(p) < min_rows:
        raise ValueError(f"need at least {min_rows} (prompt, output) pairs of equal count")
    keys = np.floor(bins_per_octave * np.log2(np.maximum(p, 1.0))).astype(int)
    groups: list[list[int]] = []  # bin keys per merged bin
    counts: list[int] = []
    pending: list[int] = []
    pending_n = 0
    for key in sorted(set(keys.tolist())):
        pending.append(key)
        pending_n += int((keys == key).sum())
        if pending_n >= min_rows:
            groups.append(pending)
            counts.append(pending_n)
            pending, pending_n = [], 0
    if pending:
        if groups:
            groups[-1] += pending
        else:
            groups.append(pending)
    grid = np.linspace(0.0, 1.0, levels)
    lower, values = [], []
    for group in groups:
        rows = o[np.isin(keys, group)]
        lower.append(min(group) / bins_per_octave)
        values.append(tuple(float(v) for v in np.quantile(rows, grid)))
    return LengthTable(tuple(lower), tuple(values), dict(meta or {}))


class TablePredictor(LengthPredictor):
    """The table alone (static): the bound depends on the prompt's length and what is generated."""

    name = "table"

    def __init__(self, table: LengthTable, quantile: float = 0.9) -> None:
        self.table = table
        self.quantile = quantile

    def fit(self, samples: Sequence[LengthSample]) -> TablePredictor:
        self.table = fit_table([s.prompt_len for s in samples], [s.output_len for s in samples])
        return self

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        return self.table.quantile(prompt_len, self.quantile, generated)
