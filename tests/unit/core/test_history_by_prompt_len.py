"""The history predictor conditioned on prompt length: answers to prompts of about the same
length bound a request before the global window does, learned online through LiveLengthBounds."""

from __future__ import annotations

import pickle

import pytest

from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor, prompt_len_band
from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.analyzer.spec import predictor_from_spec


def test_bands_are_half_an_octave_wide() -> None:
    assert prompt_len_band(363) == prompt_len_band(511) == prompt_len_band(362) + 1
    assert prompt_len_band(512) == prompt_len_band(724) == prompt_len_band(511) + 1
    assert prompt_len_band(0) == prompt_len_band(1)  # an empty prompt has a band too


def _trained(by_prompt_len: bool) -> HistoryPredictor:
    """Short answers to ~400-token prompts, long ones to ~1200-token prompts."""
    p = HistoryPredictor(HistoryParams(quantile=0.9, min_count=20, by_prompt_len=by_prompt_len))
    for i in range(40):
        p.observe(None, 50 + i, prompt_len=400)
        p.observe(None, 400 + i, prompt_len=1200)
    return p


def test_a_band_with_enough_answers_bounds_its_prompts() -> None:
    banded, blind = _trained(True), _trained(False)
    assert banded.predict(prompt_len=420) < 100 < blind.predict(prompt_len=420)
    assert banded.predict(prompt_len=1100) > 400
    # A band it has never seen falls back to every answer, as the blind predictor does.
    assert banded.predict(prompt_len=3000) == blind.predict(prompt_len=3000)
    # Conditioned on what is already out: past 100 tokens the short band has too few answers.
    assert banded.predict(prompt_len=420, generated=100) == blind.predict(prompt_len=420, generated=100)


def test_too_few_answers_in_a_band_fall_back_to_the_global_window() -> None:
    p = HistoryPredictor(HistoryParams(quantile=0.5, min_count=20, by_prompt_len=True))
    for _ in range(19):
        p.observe(None, 10, prompt_len=100)
    p.observe(None, 1000, prompt_len=5000)
    assert p.predict(prompt_len=100) == 10.0  # the global median: 19 of 20 answers are 10
    p.observe(None, 10, prompt_len=100)
    assert p.predict(prompt_len=5000) == 10.0  # its band holds one answer: global again


def test_live_bounds_teach_the_band_of_the_prompt_they_bounded() -> None:
    predictor = predictor_from_spec("history-len:0.9")
    assert isinstance(predictor, HistoryPredictor) and predictor.by_prompt_len
    live = LiveLengthBounds(predictor)
    for i in range(40):
        for rid, prompt_len, answer in ((f"s{i}", 400, 30), (f"l{i}", 1200, 500)):
            live.bound(rid, lambda: "", prompt_len, None, 0)
            live.finished(rid, None, answer)
    assert live.bound("new-short", lambda: "", 410, None, 0) == 30
    assert live.bound("new-long", lambda: "", 1210, None, 0) == 500
    plain = predictor_from_spec("history:0.9")
    assert isinstance(plain, HistoryPredictor) and not plain.by_prompt_len


def test_artifacts_pickled_before_bands_load_without_them() -> None:
    old = HistoryPredictor(HistoryParams(min_count=1))
    old.observe(None, 7)
    for attr in ("by_prompt_len", "_per_band"):
        del old.__dict__[attr]
    revived = pickle.loads(pickle.dumps(old))
    assert revived.predict(prompt_len=400) == 7.0
    revived.observe(None, 9, prompt_len=400)  # and still learns
    assert revived.by_prompt_len is False


@pytest.mark.parametrize("spec", ["history-len:2", "history-len:x"])
def test_a_bad_quantile_names_the_spec(spec: str) -> None:
    with pytest.raises(ValueError, match=spec):
        predictor_from_spec(spec)
