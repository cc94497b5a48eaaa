"""LiveLengthBounds: cached per request, refined only at checkpoints, floored at progress."""

from __future__ import annotations

import pytest

from scheduler.core.analyzer.base import LengthPredictor
from scheduler.core.analyzer.online import LiveLengthBounds, learns_online
from scheduler.core.analyzer.spec import COLD_START, live_length_bounds, predictor_from_spec


class CountingPredictor(LengthPredictor):
    name = "counting"

    def __init__(self) -> None:
        self.calls: list[int] = []

    def predict(self, prompt_text, prompt_len, app_id=None, generated=0, generated_text=""):  # noqa: ANN001
        self.calls.append(generated)
        self.texts = [*getattr(self, "texts", []), generated_text]
        return 100.0 + generated  # grows as generation proceeds


def test_repredicts_only_when_crossing_a_checkpoint() -> None:
    p = CountingPredictor()
    live = LiveLengthBounds(p, refine_every=10)
    for g in range(0, 25):
        live.bound("r1", lambda: "hi", 3, None, g)
    assert p.calls == [0, 10, 20]
    assert live.predictions == 3


def test_bound_never_below_generated_plus_one() -> None:
    class Tiny(CountingPredictor):
        def predict(self, *a, **k):  # noqa: ANN002, ANN003
            return 5.0

    live = LiveLengthBounds(Tiny(), refine_every=100)
    assert live.bound("r", lambda: "x", 1, None, 0) == 5.0
    assert live.bound("r", lambda: "x", 40, None, 40) == 41.0


def test_requests_are_independent_and_forgettable() -> None:
    p = CountingPredictor()
    live = LiveLengthBounds(p, refine_every=10)
    live.bound("a", lambda: "x", 1, None, 0)
    live.bound("b", lambda: "x", 1, None, 0)
    assert len(live) == 2 and p.calls == [0, 0]
    entry = live.forget("a")
    assert entry is not None and entry.initial == 100.0
    assert live.forget("a") is None and len(live) == 1


def test_capacity_evicts_oldest() -> None:
    live = LiveLengthBounds(CountingPredictor(), refine_every=10, max_entries=2)
    for rid in ("a", "b", "c"):
        live.bound(rid, lambda: "x", 1, None, 0)
    assert len(live) == 2 and live.forget("a") is None


def test_prompt_text_is_decoded_once_per_request() -> None:
    decoded = []

    def text() -> str:
        decoded.append(1)
        return "prompt"

    live = LiveLengthBounds(CountingPredictor(), refine_every=5)
    for g in range(20):
        live.bound("r", text, 2, None, g)
    assert len(decoded) == 1


def test_refinement_sees_the_generated_prefix_at_its_checkpoint() -> None:
    p = CountingPredictor()
    live = LiveLengthBounds(p, refine_every=10)
    asked: list[int] = []

    def so_far(n: int) -> str:
        asked.append(n)
        return "tok " * n

    for g in range(0, 21):
        live.bound("r", lambda: "x", 1, None, g, so_far)
    assert asked == [10, 20]  # never decoded at arrival, once per checkpoint after
    assert p.texts == ["", "tok " * 10, "tok " * 20]


def test_the_history_spec_bounds_nothing_until_it_has_learned_then_its_quantile() -> None:
    live = live_length_bounds("history:0.9")
    assert live is not None
    for i in range(COLD_START - 1):  # answered requests teach it
        live.bound(f"r{i}", str, 3, None, 0)
        live.finished(f"r{i}", None, 10 * (i + 1))
    assert live.bound("early", str, 3, None, 0) is None  # no guess yet: the client's cap rules
    for i in range(COLD_START - 1, 100):
        live.finished(f"r{i}", None, 10 * (i + 1))
    assert 880 <= live.bound("late", str, 3, None, 0) <= 920  # the 90th percentile of 10..1000
    for i in range(1000):  # the window fills with short answers
        live.finished(f"s{i}", None, 5)
    assert live.bound("newer", str, 3, None, 0) < 10  # a newcomer gets the new history's bound
    assert 880 <= live.bound("late", str, 3, None, 0) <= 920  # a request keeps its bound until its next checkpoint


def test_an_artifact_or_none_learns_nothing_and_a_bad_spec_names_itself() -> None:
    assert live_length_bounds("none") is None and live_length_bounds(None) is None
    fixed = LiveLengthBounds(CountingPredictor(), refine_every=10)
    fixed.bound("r", str, 3, None, 0)
    assert fixed.finished("r", None, 7) is not None  # forgotten, and no observe() to call
    assert not learns_online(CountingPredictor())
    with pytest.raises(ValueError, match="^history:2: "):
        predictor_from_spec("history:2")


def test_a_request_that_arrived_during_the_cold_start_gets_a_bound_once_there_is_one() -> None:
    live = live_length_bounds("history:0.9")
    assert live is not None
    assert live.bound("waiting", str, 3, None, 0) is None
    for i in range(COLD_START):
        live.finished(f"r{i}", None, 40)
    assert live.bound("waiting", str, 3, None, 0) == 40.0  # still at its first checkpoint, asked again
