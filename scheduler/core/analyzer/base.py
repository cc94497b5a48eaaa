"""The one interface every output-length predictor offers, so callers swap them by name.

The adapter fills `RequestView.predicted_output_len` from `predict(...)` and the router reads the
same number; neither cares whether a forest, an MoE or a running mean produced it. A predictor
is trained offline (`fit`), saved as one artifact file, and loaded at server start.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

ARTIFACT_VERSION = 1


@dataclass(frozen=True)
class LengthSample:
    """One finished request as training data: what was asked and how long the answer was."""

    prompt_text: str
    prompt_len: int  # tokens, counted with the serving model's tokenizer
    output_len: int  # tokens
    app_id: str | None = None
    output_text: str = ""  # lets refinement models see generated prefixes at train time


class LengthPredictor:
    """Base class: `predict` returns an estimate (or upper bound) of the total output length.

    The result is in tokens and never below `generated + 1`: a request that is still running
    will produce at least one more token, so a bound at or below what exists is useless.
    """

    name: ClassVar[str] = "base"

    def fit(self, samples: Sequence[LengthSample]) -> LengthPredictor:
        raise NotImplementedError

    def predict(
        self,
        prompt_text: str = "",
        prompt_len: int = 0,
        app_id: str | None = None,
        generated: int = 0,
        generated_text: str = "",
    ) -> float:
        """The raw estimate, floored here once so no predictor can forget the promise above."""
        return floor_at_generated(self._estimate(prompt_text, prompt_len, app_id, generated, generated_text), generated)

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        """What a subclass computes: its estimate before the floor (`text` is what was generated)."""
        raise NotImplementedError

    def predict_many(self, samples: Sequence[LengthSample], generated: Sequence[int] | None = None) -> list[float]:
        """Batch form used by evaluation; subclasses override it when batching is faster."""
        gen = generated if generated is not None else [0] * len(samples)
        return [self.predict(s.prompt_text, s.prompt_len, s.app_id, g) for s, g in zip(samples, gen, strict=False)]

    def save(self, path: str | Path) -> None:
        save_predictor(self, path)


def floor_at_generated(value: float, generated: int) -> float:
    """Clamp a bound so it stays above what a still-running request already produced."""
    return float(max(value, generated + 1))


def save_predictor(predictor: LengthPredictor, path: str | Path) -> None:
    """One pickle file holding the fitted predictor plus a small header to check on load."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    blob = {"version": ARTIFACT_VERSION, "name": predictor.name, "predictor": predictor}
    with path.open("wb") as f:
        pickle.dump(blob, f, protocol=pickle.HIGHEST_PROTOCOL)


def load_predictor(path: str | Path, expect: str | None = None) -> LengthPredictor:
    """Load an artifact written by `save_predictor`; `expect` guards against a wrong file."""
    with Path(path).open("rb") as f:
        blob = pickle.load(f)  # noqa: S301 - artifacts are produced by our own train CLI
    if not isinstance(blob, dict) or blob.get("version") != ARTIFACT_VERSION:
        raise ValueError(f"{path}: not a predictor artifact of version {ARTIFACT_VERSION}")
    if expect is not None and blob["name"] != expect:
        raise ValueError(f"{path}: holds predictor {blob['name']!r}, expected {expect!r}")
    return blob["predictor"]
