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


def test_the_apps_remembered_are_bounded_least_recent_first():
    import pickle

    h = HistoryPredictor(HistoryParams(min_count=1, max_apps=3))
    for app in ("a", "b", "c"):
        h.observe(app, 10)
    h.observe("a", 10)  # seen again: now the most recent
    h.observe("d", 99)  # a fourth app: "b", the least recent, goes
    assert list(h._per_app) == ["c", "a", "d"]
    assert h.predict(app_id="d") == 99
    old = HistoryPredictor(HistoryParams(min_count=1))
    del old.__dict__["max_apps"]
    old._per_app = dict(old._per_app)  # as pickled before the bound existed
    revived = pickle.loads(pickle.dumps(old))
    revived.observe("x", 5)
    assert revived.max_apps == HistoryParams.max_apps
