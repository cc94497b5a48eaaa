"""QRF upper bound: calibrated at its quantile, refined without dropping below what exists."""

from __future__ import annotations

import numpy as np
import pytest

from scheduler.core.analyzer import load_predictor
from scheduler.core.analyzer.data import first_turns, iter_json_array, to_samples
from scheduler.core.analyzer.predictors import make_predictor
from scheduler.core.analyzer.qrf import QrfParams, QrfPredictor, conformal_quantile
from tests.unit.core._analyzer_synth import make_samples


@pytest.fixture(scope="module")
def data():
    return make_samples(500, seed=0), make_samples(600, seed=1)


@pytest.fixture(scope="module")
def qrf(data) -> QrfPredictor:
    return make_predictor("qrf", quantile=0.9, refine_every=20, n_estimators=25, max_checkpoints=8).fit(data[0])


def test_bound_is_calibrated_and_beats_constant(qrf, data):
    train, test = data
    y = np.array([s.output_len for s in test], float)
    bound = np.array(qrf.predict_many(test))
    under = float((bound < y).mean())
    assert under <= 0.17, under
    # The constant baseline at the same quantile is what a length-blind scheduler would use.
    const = np.quantile([s.output_len for s in train], 0.9)
    assert np.abs(bound - y).mean() < 0.7 * np.abs(const - y).mean()
    # And the bound separates short tasks from long ones.
    short = np.array([s.prompt_text.startswith("translate") for s in test])
    assert bound[short].mean() < 0.3 * bound[~short].mean()


CHECKPOINTS = (0, 40, 100, 200, 400)


def running_at(test, g):
    run = [s for s in test if s.output_len > g]
    return run, np.array([s.output_len for s in run], float)


def test_refined_bound_is_calibrated_among_running_requests(qrf, data):
    """The bound for a request still running after g tokens is a q=0.9 bound on L given L > g:
    on held-out requests it under-estimates about 10 % at every checkpoint, not only at g=0."""
    train, test = data
    train_len = np.array([s.output_len for s in train], float)
    for g in CHECKPOINTS:
        run, y = running_at(test, g)
        assert len(run) >= 60, (g, len(run))
        refined = np.array(qrf.predict_many(run, [g] * len(run)))
        under = float((refined < y).mean())
        assert under <= 0.15, (g, under)
        assert under >= 0.02, (g, under)  # a bound that is never exceeded is not a q=0.9 bound
        # Sharper than the text-blind bound at the same quantile and the same "still running"
        # condition while tasks still mix (past g=200 only "implement" answers are running).
        if g <= 200:
            blind_const = np.quantile(train_len[train_len > g], 0.9)
            assert np.abs(refined - y).mean() < np.abs(blind_const - y).mean(), g


def test_refined_bound_without_generated_text_is_calibrated(qrf, data):
    """The live path may pass only the generated count (no text): its own conformal table."""
    test = data[1]
    for g in CHECKPOINTS[1:]:
        run, y = running_at(test, g)
        rows = [(s.prompt_text, s.prompt_len, s.app_id, g, "") for s in run]
        blind = np.maximum(qrf.bound(rows), g + 1)
        assert float((blind < y).mean()) <= 0.15, g
    s = run[0]
    assert qrf.predict(s.prompt_text, s.prompt_len, s.app_id, generated=g) == pytest.approx(blind[0])


def test_training_rows_are_a_fair_sample_of_running_requests(data):
    """Rows at checkpoint g must cover the answers longer than g regardless of their length
    (a fixed number of checkpoints per answer under-samples long answers at every g > 0)."""
    train = data[0]
    qrf = QrfPredictor(QrfParams(refine_every=20, max_checkpoints=3))
    rows, y = qrf._training_rows(train)
    g = np.array([r[3] for r in rows])
    total = y + g
    for c in (0, 40, 100, 200):
        longer = np.array([s.output_len for s in train if s.output_len > c])
        at_c = total[g == c]
        assert (at_c > c).all()  # a request that already ended is no row for checkpoint c
        assert abs(np.median(at_c) - np.median(longer)) <= 0.2 * np.median(longer), c


def test_conformal_quantile_is_the_finite_sample_level():
    scores = np.arange(1.0, 11.0)  # 10 scores: ceil(11 * 0.9) = 10th smallest
    assert conformal_quantile(scores, 0.9) == 10.0
    assert conformal_quantile(scores, 0.5) == 6.0
    assert conformal_quantile(np.array([3.0]), 0.9) == 3.0


def test_single_predict_matches_batch(qrf, data):
    s = data[1][3]
    assert qrf.predict(s.prompt_text, s.prompt_len, s.app_id) == pytest.approx(qrf.predict_many([s])[0])


def test_refinement_never_below_generated_and_tightens(qrf, data):
    test = data[1]
    y = np.array([s.output_len for s in test], float)
    errors = []
    for frac in (0.0, 0.5, 0.97):
        gens = [int(s.output_len * frac) for s in test]
        bound = np.array(qrf.predict_many(test, gens))
        assert (bound >= np.array(gens) + 1).all()
        errors.append(float(np.abs(bound - y).mean()))
    assert errors[-1] < 0.6 * errors[0], errors
    # A request far past any plausible length still gets a bound above what it produced.
    s = test[0]
    assert qrf.predict(s.prompt_text, s.prompt_len, s.app_id, generated=5000) >= 5001


def test_save_load_round_trip(qrf, data, tmp_path):
    path = tmp_path / "qrf.pkl"
    qrf.save(path)
    loaded = load_predictor(path, expect="qrf")
    test = data[1][:20]
    gens = [s.output_len // 2 for s in test]
    assert loaded.predict_many(test, gens) == qrf.predict_many(test, gens)
    with pytest.raises(ValueError):
        load_predictor(path, expect="moe")


def test_rejects_bad_quantile():
    with pytest.raises(ValueError):
        QrfPredictor(QrfParams(quantile=1.0))


# Training data path: the packaged ShareGPT JSON is truncated mid-record.
TRUNCATED = """[
  {"id": "a_0", "conversations": [{"from": "human", "value": "hi, [list] {x}"},
                                  {"from": "gpt", "value": "hello there"}]},
  {"id": "b_0", "conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "q"},
                                  {"from": "gpt", "value": "a, b"}]} ,
  {"id": "c_0", "conversations": [{"from": "human", "value": "cut here"}, {"from": "gpt", "value": "never fin"""


def test_truncated_sharegpt_recovers_complete_records():
    records = list(iter_json_array(TRUNCATED))
    assert [r["id"] for r in records] == ["a_0", "b_0"]
    turns = list(first_turns(records))
    assert turns == [("a_0", "hi, [list] {x}", "hello there"), ("b_0", "q", "a, b")]
    samples = to_samples(turns, lambda texts: [len(t.split()) for t in texts], max_output=1)
    assert [s.output_len for s in samples] == [1, 1]
    assert list(iter_json_array("[]")) == []
    with pytest.raises(ValueError):
        list(iter_json_array('{"a": 1}'))
