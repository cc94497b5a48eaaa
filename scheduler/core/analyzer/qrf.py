"""Output-length upper bound from a quantile regression forest, refined as tokens are generated.

JITServe §4.1 / Tempo §4.1: a high quantile of the length distribution is a conservative bound
(over-provision first), and re-invoking the forest every N generated tokens with the generated
prefix as extra input relaxes it. The forest learns that refinement from training rows taken at
checkpoints g = 0, N, 2N, ... of each answer whose true length exceeds g. It regresses the
*remaining* length L - g given (prompt, g, prefix), so a "wrapping up" prefix means "few tokens
left" whatever the task, and the bound g + remaining slides toward the truth as g grows.

Calibration. A bound for a request still running at g must be the q-quantile of L given L > g,
so the rows at checkpoint g must be a fair sample of *all* answers longer than g. Picking a fixed
number of checkpoints per answer broke that: a long answer spread its few rows over many
checkpoints, so the rows at any g > 0 over-represented short answers and refined bounds
under-estimated about twice as often as they should (20 % at q = 0.9). Here every answer has a
row at every checkpoint below its length; past the first `max_checkpoints` the rows are thinned
with a probability that depends on the checkpoint only, never on the answer's length. On top,
split conformal calibration (grouped by request: a held-out share of the requests, each one row
per checkpoint) adds per checkpoint bucket the finite-sample q-quantile of the held-out log
ratio truth/bound, which restores coverage where the forest is still off (for instance when
one request's neighbouring checkpoints share a leaf) and tightens it where the forest is too
conservative.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from quantile_forest import RandomForestQuantileRegressor

from scheduler.core.analyzer.base import LengthPredictor, LengthSample, floor_at_generated
from scheduler.core.analyzer.features import TextFeaturizer
from scheduler.core.registry import require


def truncate_share(text: str, keep: int, of: int) -> str:
    """The first keep/of share of `text`'s characters (token positions approximated by chars)."""
    if keep <= 0 or not text or of <= 0:
        return ""
    return text[: int(len(text) * min(keep, of) / of)]


def generated_prefix(text: str, generated: int, total: int) -> str:
    """Approximate the first `generated` tokens of an answer by the same share of its characters."""
    return truncate_share(text, generated, total)


Row = tuple[str, int, str | None, int, str]  # prompt text, prompt len, app id, checkpoint g, prefix


def conformal_quantile(scores: np.ndarray, q: float) -> float:
    """Split-conformal level: the ceil((n+1)q)-th smallest score (the largest one if that is past n)."""
    s = np.sort(np.asarray(scores, dtype=float))
    k = min(len(s), int(np.ceil((len(s) + 1) * q))) - 1
    return float(s[max(k, 0)])


@dataclass(frozen=True)
class QrfParams:
    quantile: float = 0.9  # of the length distribution: the bound's level
    refine_every: int = 50  # N: checkpoints at g = 0, N, 2N, ...
    max_checkpoints: int = 8
    n_estimators: int = 40
    min_samples_leaf: int = 20
    max_depth: int | None = 14
    max_features: float = 0.3
    n_components: int = 24
    n_gen_components: int = 8
    n_bag: int = 128
    calibration_frac: float = 0.2  # share of requests held out for conformal calibration
    min_calibration: int = 40
    calibration: str = "log"
    max_samples_leaf: int | None = 200
    seed: int = 0

    def __post_init__(self) -> None:
        require(0.0 < self.quantile < 1.0, "quantile", "must be in (0, 1)", self.quantile)
        require(self.refine_every > 0, "refine_every", "must be positive", self.refine_every)
        require(0.0 <= self.calibration_frac < 1.0, "calibration_frac", "must be in [0, 1)", self.calibration_frac)
        require(self.calibration in ("log", "add"), "calibration", "must be 'log' or 'add'", self.calibration)


class QrfPredictor(LengthPredictor):
    name = "qrf"

    def __init__(self, params: QrfParams = QrfParams()) -> None:
        seed = params.seed
        self.quantile = params.quantile
        self.refine_every = params.refine_every
        self.max_checkpoints = params.max_checkpoints
        self.calibration_frac = params.calibration_frac
        self.min_calibration = params.min_calibration
        self.calibration = params.calibration
        self.seed = seed
        # Conformal corrections: bucket i covers checkpoints >= cal_starts[i] (ascending).
        self.cal_starts = np.zeros(0)
        self.cal_shift = np.zeros(0)
        self.cal_shift_blind = np.zeros(0)  # the same for rows at g > 0 without generated text
        self.featurizer = TextFeaturizer(params.n_components, params.n_gen_components, params.n_bag, seed=seed)
        self.forest = RandomForestQuantileRegressor(
            n_estimators=params.n_estimators,
            min_samples_leaf=params.min_samples_leaf,
            max_depth=params.max_depth,
            max_features=params.max_features,
            max_samples_leaf=params.max_samples_leaf,  # cap: the dense leaf table is padded to the largest leaf
            random_state=seed,
            n_jobs=1,
        )

    def checkpoint(self, generated: int) -> int:
        """The refinement point a request at `generated` tokens is evaluated at (a multiple of N)."""
        return (max(generated, 0) // self.refine_every) * self.refine_every

    def _checkpoints(self, output_len: int, rng: np.random.Generator | None) -> list[int]:
        """Checkpoints g < output_len that get a training row (every one when rng is None).

        The k-th checkpoint (k >= max_checkpoints) is kept with probability max_checkpoints / k:
        it depends on g only, so the rows at any g stay a fair sample of the answers longer
        than g, while a very long answer costs O(max_checkpoints * log) rows, not O(L / N).
        """
        grid = range(0, max(output_len, 0), self.refine_every)
        if rng is None:
            return list(grid)
        keep = []
        for k, g in enumerate(grid):
            if k < self.max_checkpoints or rng.random() < self.max_checkpoints / k:
                keep.append(g)
        return keep

    def _rows(self, samples: Sequence[LengthSample], rng: np.random.Generator | None) -> tuple[list[Row], np.ndarray]:
        rows: list[Row] = []
        targets: list[float] = []
        for s in samples:
            for g in self._checkpoints(s.output_len, rng):
                rows.append(
                    (s.prompt_text, s.prompt_len, s.app_id, g, generated_prefix(s.output_text, g, s.output_len))
                )
                targets.append(float(s.output_len - g))
        return rows, np.asarray(targets)

    def _training_rows(self, samples: Sequence[LengthSample]) -> tuple[list[Row], np.ndarray]:
        return self._rows(samples, np.random.default_rng(self.seed))

    def _features(self, rows: Sequence[Row]) -> np.ndarray:
        texts, lens, apps, gens, gtexts = zip(*rows, strict=False)
        return self.featurizer.transform(texts, lens, apps, gens, gtexts)

    def fit(self, samples: Sequence[LengthSample]) -> QrfPredictor:
        if not samples:
            raise ValueError("no training samples")
        # Split by request, not by row: a request's checkpoints are strongly correlated, so a
        # calibration row whose siblings were in training would look better than a new request.
        n_cal = int(len(samples) * self.calibration_frac)
        if n_cal < self.min_calibration:
            n_cal = 0
        order = np.random.default_rng(self.seed + 1).permutation(len(samples))
        cal = [samples[i] for i in order[:n_cal]]
        fit_on = [samples[i] for i in order[n_cal:]] if n_cal else list(samples)
        rows, y = self._training_rows(fit_on)
        self.featurizer.fit([s.prompt_text for s in fit_on], [r[4] for r in rows])
        self.forest.fit(self._features(rows), y, sparse_pickle=True)  # padded leaf table: pickle sparse
        self.cal_starts = self.cal_shift = self.cal_shift_blind = np.zeros(0)
        if cal:
            self._calibrate(cal)
        return self

    def _calibrate(self, cal: Sequence[LengthSample]) -> None:
        """Per checkpoint bucket, the conformal q-quantile of truth vs. raw bound on held-out requests.

        Two tables: one for rows that carry the generated prefix and one for rows at g > 0
        without it (callers such as `LiveLengthBounds` may pass only the count); the forest
        never saw the latter, so their raw bound is far off and only calibration fixes it.
        """
        rows, remaining = self._rows(cal, None)  # every checkpoint: one row per request per checkpoint
        g = np.array([r[3] for r in rows], dtype=float)
        # Buckets of consecutive checkpoints with >= min_calibration rows each (a short last
        # bucket joins the one before), so far checkpoints with few long answers pool together.
        levels, counts = np.unique(g, return_counts=True)
        starts: list[float] = []
        acc = 0
        for level, c in zip(levels, counts, strict=True):
            if not starts or acc >= self.min_calibration:
                starts.append(float(level))
                acc = 0
            acc += int(c)
        if len(starts) > 1 and acc < self.min_calibration:
            starts.pop()
        self.cal_starts = np.asarray(starts)
        which = np.searchsorted(self.cal_starts, g, side="right") - 1
        blind = [(p, pl, a, gg, "") for p, pl, a, gg, _ in rows]
        tables = []
        for variant in (rows, blind):
            scores = self._scores(variant, g, remaining)
            tables.append([conformal_quantile(scores[which == i], self.quantile) for i in range(len(starts))])
        self.cal_shift, self.cal_shift_blind = np.array(tables[0]), np.array(tables[1])

    def _scores(self, rows: Sequence[Row], g: np.ndarray, remaining: np.ndarray) -> np.ndarray:
        raw = self._raw_bound(rows, self.quantile)
        if self.calibration == "log":
            return np.log(remaining) - np.log(np.maximum(raw - g, 1.0))
        return g + remaining - raw

    def _raw_bound(self, rows: Sequence[Row], quantile: float) -> np.ndarray:
        remaining = np.asarray(self.forest.predict(self._features(rows), quantiles=quantile), dtype=float).reshape(-1)
        return np.array([r[3] for r in rows], dtype=float) + remaining

    def bound(self, rows: Sequence[Row], quantile: float | None = None) -> np.ndarray:
        """Total-length bound for feature rows: checkpoint + forest quantile of the remainder,
        conformally corrected per checkpoint bucket (at the trained quantile only)."""
        q = self.quantile if quantile is None else quantile
        raw = self._raw_bound(rows, q)
        if q != self.quantile or not len(getattr(self, "cal_starts", ())):  # older artifacts: uncalibrated
            return raw
        g = np.array([r[3] for r in rows], dtype=float)
        bucket = np.clip(np.searchsorted(self.cal_starts, g, side="right") - 1, 0, None)
        blind = np.array([r[3] > 0 and not r[4] for r in rows])
        shift = np.where(blind, self.cal_shift_blind[bucket], self.cal_shift[bucket])
        if self.calibration == "log":
            return g + np.maximum(raw - g, 1.0) * np.exp(shift)
        return raw + shift

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        # Evaluate at the last checkpoint, with the text generated up to it, as in training.
        g = self.checkpoint(generated)
        return self.bound([(prompt_text, prompt_len, app_id, g, truncate_share(text, g, generated))])[0]

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
