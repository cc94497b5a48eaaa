"""The table step-time model (PolyServe §4.5): a profiled (token batch size, KV tokens) →
time table, bilinearly interpolated, linearly extrapolated past its edges, and learned online
from measured iterations. See perf_model.py for the family."""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.core.perf_profiles import as_profile
from scheduler.core.step_time import StepTimeModel, batch_tokens


def _axis_position(axis: Sequence[float], value: float) -> tuple[int, float]:
    """Left cell index and fractional position; t outside [0, 1] extrapolates linearly. Plain
    Python on a list: a simulator asks this hundreds of thousands of times per run."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(axis, value) - 1, 0), len(axis) - 2)
    return i, (value - axis[i]) / (axis[i + 1] - axis[i])


class TablePerfModel(StepTimeModel):
    """time(batch_tokens, kv_tokens) from a profiled grid; batch tokens = prefill + decode + spec.

    PolyServe drops prefill attention from the prediction (small next to GEMMs and decode
    attention for chunked prefill under ~10K context); so does this table.
    """

    def __init__(
        self,
        batch_axis: Sequence[float],
        kv_axis: Sequence[float],
        time_s: Sequence[Sequence[float]],
        step_size: float = 0.5,
    ) -> None:
        self.batch_axis = np.asarray(batch_axis, dtype=float)
        self.kv_axis = np.asarray(kv_axis, dtype=float)
        self.time_s = np.array(time_s, dtype=float)
        if self.time_s.shape != (len(self.batch_axis), len(self.kv_axis)):
            raise ValueError(f"time_s must be {len(self.batch_axis)}x{len(self.kv_axis)}, got {self.time_s.shape}")
        for name, axis in (("batch_tokens", self.batch_axis), ("kv_tokens", self.kv_axis)):
            if len(axis) == 0 or np.any(np.diff(axis) <= 0):
                raise ValueError(f"{name} axis must be non-empty and strictly increasing")
        if not 0 < step_size < 2:
            raise ValueError("step_size must lie in (0, 2) for the online update to converge")
        self.step_size = step_size
        self._batch_list: list[float] = self.batch_axis.tolist()
        self._kv_list: list[float] = self.kv_axis.tolist()
        self._rows_cache: list[list[float]] | None = None

    def _corners(self, b: float, k: float) -> list[tuple[int, int, float]]:
        i, tb = _axis_position(self._batch_list, b)
        j, tk = _axis_position(self._kv_list, k)
        wb = [(i, 1.0 - tb), (i + 1, tb)] if len(self.batch_axis) > 1 else [(0, 1.0)]
        wk = [(j, 1.0 - tk), (j + 1, tk)] if len(self.kv_axis) > 1 else [(0, 1.0)]
        return [(bi, kj, w1 * w2) for bi, w1 in wb for kj, w2 in wk]

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        b = batch_tokens(prefill_tokens, decode_reqs, spec_tokens)
        if b <= 0:
            return 0.0
        rows = self._rows
        value = sum(w * rows[i][j] for i, j, w in self._corners(b, kv_tokens))
        return max(float(value), 0.0)

    @property
    def _rows(self) -> list[list[float]]:
        """time_s as nested lists, rebuilt only after the grid changed (observe)."""
        if self._rows_cache is None:
            self._rows_cache = self.time_s.tolist()
        return self._rows_cache

    def observe(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, measured_s: float
    ) -> None:
        """Normalised LMS on the grid nodes that produced this prediction: the prediction here
        moves `step_size` of the way to the measurement; far-away cells are untouched."""
        b = batch_tokens(prefill_tokens, decode_reqs, spec_tokens)
        if b <= 0 or not math.isfinite(measured_s) or measured_s < 0:
            return
        corners = self._corners(b, kv_tokens)
        err = measured_s - sum(w * self.time_s[i, j] for i, j, w in corners)
        norm = sum(w * w for _, _, w in corners)
        if norm <= 0:
            return
        for i, j, w in corners:
            self.time_s[i, j] += self.step_size * err * w / norm
        self._rows_cache = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_tokens": self.batch_axis.tolist(),
            "kv_tokens": self.kv_axis.tolist(),
            "time_s": self.time_s.tolist(),
        }

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> TablePerfModel:
        return cls(section["batch_tokens"], section["kv_tokens"], section["time_s"])

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | str | Path) -> TablePerfModel:
        profile = as_profile(profile)
        if "table" not in profile:
            raise ValueError("profile has no 'table' section")
        return cls.from_dict(profile["table"])
