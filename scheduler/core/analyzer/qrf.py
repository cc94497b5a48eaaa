"""Output-length upper bound from a quantile regression forest, refined as tokens are generated.

JITServe §4.1 / Tempo §4.1: a high quantile of the length distribution is a conservative bound
(over-provision first), and re-invoking the forest every N generated tokens with the generated
prefix as extra input relaxes it. The forest learns that refinement from training rows taken at
checkpoints g = 0, N, 2N, ... of each answer whose true length exceeds g. It regresses the
*remaining* length L - g given (prompt, g, prefix), so a "wrapping up" prefix means "few tokens
left" whatever the task, and the bound g + remaining slides toward the truth as g grows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from quantile_forest import RandomForestQuantileRegressor

from scheduler.core.analyzer.base import LengthPredictor, LengthSample, floor_at_generated, register
from scheduler.core.analyzer.features import TextFeaturizer


def truncate_share(text: str, keep: int, of: int) -> str:
    """The first keep/of share of `text`'s characters (token positions approximated by chars)."""
    if keep <= 0 or not text or of <= 0:
        return ""
    return text[: int(len(text) * min(keep, of) / of)]


def generated_prefix(text: str, generated: int, total: int) -> str:
    """Approximate the first `generated` tokens of an answer by the same share of its characters."""
    return truncate_share(text, generated, total)


@register("qrf")
class QrfPredictor(LengthPredictor):
    def __init__(
        self,
        quantile: float = 0.9,
        refine_every: int = 50,
        max_checkpoints: int = 6,
        n_estimators: int = 40,
        min_samples_leaf: int = 20,
        max_depth: int | None = 14,
        max_features: float = 0.3,
        n_components: int = 24,
        n_gen_components: int = 8,
        n_bag: int = 128,
        seed: int = 0,
    ) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if refine_every <= 0:
            raise ValueError("refine_every must be positive")
        self.quantile = quantile
        self.refine_every = refine_every
        self.max_checkpoints = max_checkpoints
        self.seed = seed
        self.featurizer = TextFeaturizer(n_components, n_gen_components, n_bag, seed=seed)
        self.forest = RandomForestQuantileRegressor(
            n_estimators=n_estimators,
            min_samples_leaf=min_samples_leaf,
            max_depth=max_depth,
            max_features=max_features,
            max_samples_leaf=None,  # keep every leaf sample: quantiles need the distribution
            random_state=seed,
            n_jobs=1,
        )

    def checkpoint(self, generated: int) -> int:
        """The refinement point a request at `generated` tokens is evaluated at (a multiple of N)."""
        return (max(generated, 0) // self.refine_every) * self.refine_every

    def _training_rows(self, samples: Sequence[LengthSample]) -> tuple[list, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        rows: list[tuple[str, int, str | None, int, str]] = []
        targets: list[float] = []
        for s in samples:
            later = np.arange(self.refine_every, s.output_len, self.refine_every)
            if len(later) > self.max_checkpoints - 1:
                later = np.sort(rng.choice(later, self.max_checkpoints - 1, replace=False))
            for g in [0, *later.tolist()]:
                rows.append(
                    (s.prompt_text, s.prompt_len, s.app_id, g, generated_prefix(s.output_text, g, s.output_len))
                )
                targets.append(float(s.output_len - g))
        return rows, np.asarray(targets)

    def _features(self, rows: Sequence[tuple[str, int, str | None, int, str]]) -> np.ndarray:
        texts, lens, apps, gens, gtexts = zip(*rows, strict=False)
        return self.featurizer.transform(texts, lens, apps, gens, gtexts)

    def fit(self, samples: Sequence[LengthSample]) -> QrfPredictor:
        if not samples:
            raise ValueError("no training samples")
        rows, y = self._training_rows(samples)
        self.featurizer.fit([s.prompt_text for s in samples], [r[4] for r in rows])
        self.forest.fit(self._features(rows), y)
        return self

    def bound(self, rows: Sequence[tuple[str, int, str | None, int, str]], quantile: float | None = None) -> np.ndarray:
        """Total-length bound for feature rows: checkpoint + forest quantile of the remainder."""
        q = self.quantile if quantile is None else quantile
        remaining = np.asarray(self.forest.predict(self._features(rows), quantiles=q), dtype=float).reshape(-1)
        return np.array([r[3] for r in rows], dtype=float) + remaining

    def predict(
        self,
        prompt_text: str,
        prompt_len: int,
        app_id: str | None = None,
        generated: int = 0,
        generated_text: str = "",
    ) -> float:
        # Evaluate at the last checkpoint, with the text generated up to it, as in training.
        g = self.checkpoint(generated)
        text = truncate_share(generated_text, g, generated)
        raw = self.bound([(prompt_text, prompt_len, app_id, g, text)])[0]
        return floor_at_generated(raw, generated)

    def predict_many(self, samples: Sequence[LengthSample], generated: Sequence[int] | None = None) -> list[float]:
        gens = list(generated) if generated is not None else [0] * len(samples)
        rows = [
            (
                s.prompt_text,
                s.prompt_len,
                s.app_id,
                self.checkpoint(g),
                generated_prefix(s.output_text, self.checkpoint(g), s.output_len),
            )
            for s, g in zip(samples, gens, strict=False)
        ]
        raw = self.bound(rows)
        return [floor_at_generated(r, g) for r, g in zip(raw, gens, strict=False)]
