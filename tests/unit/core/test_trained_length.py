"""The trained length table and the server default built on it: a table fitted on one slice and
loaded from its JSON bounds a held-out slice better than a constant and than the recent-answers
quantile, never from the bounded request's own length, and yields to the history on traffic
unlike the table's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, predictor_from_spec
from scheduler.core.analyzer.table import LengthTable, fit_table
from scheduler.core.analyzer.trained import BUNDLED_TABLE, COLD_START, TrainedPredictor, pinball

Q = 0.9


def _slice(n: int, seed: int) -> list[tuple[int, int]]:
    """(prompt, answer) pairs where the prompt's length tells the answer's: short prompts get
    short answers, long ones long answers (as a chat trace's prompt bands do)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        if rng.random() < 0.5:
            out.append((rng.randint(100, 300), rng.randint(20, 80)))
        else:
            out.append((rng.randint(900, 1200), rng.randint(300, 500)))
    return out


def _loss(bounds: list[float], rows: list[tuple[int, int]]) -> float:
    return float(np.mean([pinball(b, y, Q) for b, (_, y) in zip(bounds, rows)]))


def _saved_table(tmp_path, rows) -> str:
    path = tmp_path / "table.json"
    fit_table([p for p, _ in rows], [o for _, o in rows], min_rows=50).save(path)
    return str(path)


def test_a_loaded_table_beats_a_constant_and_the_recent_answers_on_held_out_rows(tmp_path) -> None:
    train, test = _slice(2000, seed=1), _slice(500, seed=2)
    predictor = predictor_from_spec(_saved_table(tmp_path, train))
    assert isinstance(predictor, TrainedPredictor)
    history = HistoryPredictor(HistoryParams(quantile=Q))
    for p, o in train:
        history.observe(None, o, p)
    trained_bounds, history_bounds = [], []
    for p, o in test:  # both learn online, each bound made before its answer is seen
        trained_bounds.append(predictor.predict("", p))
        history_bounds.append(history.predict("", p))
        predictor.observe(None, o, p)
        history.observe(None, o, p)
    constant = float(np.quantile([o for _, o in train], Q))
    trained = _loss(trained_bounds, test)
    assert trained < 0.5 * _loss(history_bounds, test)
    assert trained < 0.5 * _loss([constant] * len(test), test)
    under = np.mean([b < y for b, (_, y) in zip(trained_bounds, test)])
    assert 0.03 < under < 0.2  # a 0.9 bound: about one answer in ten runs past it


def test_a_bound_never_depends_on_the_length_it_bounds(tmp_path) -> None:
    """Change one request's answer: every bound up to and including its own stays the same; only
    later requests (which learn from its finished answer) may move."""
    rows = _slice(300, seed=3)
    path = _saved_table(tmp_path, _slice(1000, seed=4))

    def bounds(stream: list[tuple[int, int]]) -> list[float]:
        predictor = predictor_from_spec(path)
        out = []
        for p, o in stream:
            out.append(predictor.predict("", p, generated=0))
            predictor.observe(None, o, p)
        return out

    i = 150
    changed = list(rows)
    changed[i] = (rows[i][0], 100_000)
    assert bounds(rows)[: i + 1] == bounds(changed)[: i + 1]


def test_the_trained_default_yields_to_the_history_on_unlike_traffic(tmp_path) -> None:
    """Every answer takes 4 tokens, far below anything the table knows: once the histories have
    answers scored, the server's own history bounds requests, as the old default did."""
    predictor = predictor_from_spec(_saved_table(tmp_path, _slice(1000, seed=5)))
    assert predictor.predict("", 1000) > 100  # cold: the table
    for _ in range(COLD_START + predictor.min_scored + 5):
        predictor.observe(None, 4, 1000)
    assert predictor.chosen() != "table"
    assert predictor.predict("", 1000) == 4.0


def test_the_table_stays_on_traffic_like_its_own(tmp_path) -> None:
    predictor = predictor_from_spec(_saved_table(tmp_path, _slice(2000, seed=6)))
    for p, o in _slice(400, seed=7):
        predictor.observe(None, o, p)
    assert predictor.chosen() != "history"  # the prompt-blind history loses on prompt-shaped traffic


def test_a_bound_after_g_tokens_is_the_quantile_among_longer_answers() -> None:
    table = fit_table([100] * 101, list(range(0, 1010, 10)), min_rows=50)  # answers 0, 10, ..., 1000
    assert table.quantile(100, 0.5) == pytest.approx(500.0)
    assert table.quantile(100, 0.5, generated=600) == pytest.approx(800.0)  # the median of 600..1000
    assert table.quantile(100, 0.9, generated=2000) == 2001  # past every answer it knows


def test_the_default_is_the_bundled_table_and_a_bad_table_is_refused(tmp_path) -> None:
    assert DEFAULT_LENGTH_PREDICTOR == "trained:0.9"
    predictor = predictor_from_spec("trained:0.8")
    assert isinstance(predictor, TrainedPredictor) and predictor.quantile == 0.8
    assert LengthTable.load(BUNDLED_TABLE).meta["license"].startswith("CC-BY-4.0")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    with pytest.raises(ValueError, match="bad.json"):
        predictor_from_spec(str(bad))
