"""The history predictor's cold start: no global answer before `min_global` observations."""

from __future__ import annotations

import math

from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor


def test_min_global_withholds_a_guess_until_enough_answers() -> None:
    p = HistoryPredictor(HistoryParams(default=math.inf, min_global=3))
    p.observe(None, 10)
    p.observe(None, 20)
    assert math.isinf(p.predict())
    p.observe(None, 30)
    assert p.predict() == 20.0
    assert HistoryPredictor().fit([]).predict() == 256.0  # defaults unchanged: answers from one sample on
    one = HistoryPredictor()
    one.observe(None, 7)
    assert one.predict() == 7.0
