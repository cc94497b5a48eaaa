"""The history predictor's sorted windows answer what numpy answered on the raw window."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor, linear_quantile


@pytest.mark.parametrize("seed", range(5))
def test_linear_quantile_is_numpys_default_bit_for_bit(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        n = rng.randint(1, 300)
        values = sorted(rng.choice([rng.randint(1, 4), rng.randint(1, 3000)]) for _ in range(n))
        q = rng.choice([0.1, 0.5, 0.9, 0.99, rng.random()])
        start = rng.randint(0, n - 1)
        assert linear_quantile(values, q, start) == float(np.quantile(np.array(values[start:], dtype=float), q))


def _numpy_predict(window: list[int], per_app: list[int], params: HistoryParams, generated: int) -> float:
    """The predictor's rule written over numpy arrays, as it was before the sorted windows."""
    for pool, is_global in ((per_app, False), (window, True)):
        values = np.array(pool, dtype=float)
        values = values[values > generated]
        if len(values) >= params.min_count or (is_global and len(values) >= max(1, params.min_global)):
            stat = values.mean() if params.quantile is None else np.quantile(values, params.quantile)
            return float(max(float(stat), generated + 1))
    return float(max(params.default, generated + 1))


@pytest.mark.parametrize("params", [HistoryParams(), HistoryParams(quantile=0.9, window=40, min_count=5)])
def test_sliding_windows_predict_as_numpy_did(params: HistoryParams) -> None:
    rng = random.Random(7)
    predictor = HistoryPredictor(params)
    seen: list[int] = []
    seen_app: list[int] = []
    for _ in range(600):
        value = rng.randint(1, 900)
        app = rng.choice([None, "a"])
        predictor.observe(app, value)
        seen = (seen + [value])[-params.window :]
        if app == "a":
            seen_app = (seen_app + [value])[-params.window :]
        generated = rng.choice([0, rng.randint(0, 800)])
        expected = _numpy_predict(seen, seen_app, params, generated)
        assert predictor.predict("", 0, "a", generated) == expected
