"""MoE (GoodServe §3.2) and the history baseline, plus the shared by-name interface."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.analyzer import load_predictor
from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor
from scheduler.core.analyzer.moe import MoeParams, MoePredictor
from scheduler.core.analyzer.predictors import available, make_predictor
from scheduler.core.registry import ParamError
from tests.unit.core._analyzer_synth import make_samples


@pytest.fixture(scope="module")
def data():
    return make_samples(600, seed=2), make_samples(200, seed=3)


@pytest.fixture(scope="module")
def moe(data) -> MoePredictor:
    return make_predictor("moe", n_experts=9, max_iter=200).fit(data[0])


def test_moe_beats_global_mean(moe, data):
    train, test = data
    y = np.array([s.output_len for s in test], float)
    pred = np.array(moe.predict_many(test))
    mean = np.mean([s.output_len for s in train])
    assert np.abs(pred - y).mean() < 0.88 * np.abs(mean - y).mean()
    assert len(moe.experts) == 9
    assert moe.in_edges.shape == moe.out_edges.shape == (2,)


def test_moe_predict_floor_and_round_trip(moe, data, tmp_path):
    s = data[1][0]
    assert moe.predict(s.prompt_text, s.prompt_len, generated=10_000) >= 10_001
    moe.save(tmp_path / "moe.pkl")
    loaded = load_predictor(tmp_path / "moe.pkl")
    assert loaded.predict_many(data[1][:10]) == moe.predict_many(data[1][:10])


def test_moe_needs_square_expert_count():
    with pytest.raises(ValueError):
        MoePredictor(MoeParams(n_experts=8))


def test_history_per_app_and_conditional():
    h = HistoryPredictor(HistoryParams(quantile=None, min_count=3))
    for n in (10, 12, 14):
        h.observe("short", n)
    for n in (400, 500, 600):
        h.observe("long", n)
    assert h.predict("", 0, "short") == pytest.approx(12)
    assert h.predict("", 0, "long") == pytest.approx(500)
    # Unknown app: the global pool. Past 450 tokens: only longer history counts.
    assert h.predict("", 0, "nope") == pytest.approx(np.mean([10, 12, 14, 400, 500, 600]))
    assert h.predict("", 0, "long", generated=450) >= 500
    assert h.predict("", 0, "long", generated=900) == 901


def test_history_quantile_bound():
    h = HistoryPredictor(HistoryParams(quantile=0.9, min_count=1)).fit(make_samples(300, seed=4))
    assert h.predict("", 0, "translate") < h.predict("", 0, "implement")


def test_registry_names():
    assert {"qrf", "moe", "history"} <= set(available())
    with pytest.raises(ParamError, match="unknown predictor 'bert'; known: history, moe, qrf"):
        make_predictor("bert")
