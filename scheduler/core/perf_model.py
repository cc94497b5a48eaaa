"""Step-time models: how long one forward pass takes, so policies can size batches.

One family behind one protocol, `PerfModel`. Every member derives from `StepTimeModel`, which
answers the inverse questions (the largest decode batch, the largest prefill chunk that fits a
time budget) from the member's own `step_time`, so a member writes only the forward model:

- `RooflinePerfModel`: SLOs-Serve §3.1.1, T = max_l(k1_l·#tokens + k2_l·#spec + b_l), fitted by
  regression. We add a per-term KV coefficient (decode attention reads every KV token, which the
  token count alone misses at long contexts); with k_kv = 0 it is the paper's form. Its one-term
  special cases are `linear_model`, `constant_model` and `default_model` (the numbers used when
  no perf model is given).
- `TablePerfModel`: PolyServe §4.5, a profiled (token batch size, KV tokens) → time table,
  bilinearly interpolated (linearly extrapolated past its edges).
- Elsewhere: `OnlinePerfModel` (learned from measured iterations), `SlowedPerfModel` (an
  emulated card in dilated time), the speculative `AtSteps` (verify plus draft passes).

Roofline and table learn online from measured iterations (`observe`). Profiles are JSON files
whose format is documented in scheduler/profiles/README.md.
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

PROFILE_FORMAT = "sglang-slo-perf-profile/1"
PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles"
MAX_BATCH_LIMIT = 4096


class PerfModel(Protocol):
    """Predicts one engine iteration's wall time, and the largest batch or chunk within a budget."""

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        """Seconds for one forward pass with this many new prefill tokens, decoding requests,
        total KV tokens attended, and speculative tokens verified; 0 for an empty batch."""
        ...

    def max_batch_within(
        self,
        budget_s: float,
        kv_tokens_per_req: float,
        prefill_tokens: int = 0,
        spec_tokens_per_req: int = 0,
        extra_kv_tokens: int = 0,
        limit: int = MAX_BATCH_LIMIT,
    ) -> int:
        """Largest decode batch ≤ `limit` whose iteration fits `budget_s` (0 if none)."""
        ...

    def max_chunk_within(self, budget_s: float, decode_reqs: int, kv_tokens: int, limit: int) -> int:
        """Largest prefill chunk ≤ `limit` that fits `budget_s` beside these decodes (0 if none)."""
        ...


@dataclass(frozen=True)
class Sample:
    """One measured (or profiled) iteration; `time_s` in seconds."""

    prefill_tokens: int
    decode_reqs: int
    kv_tokens: int
    spec_tokens: int
    time_s: float


def batch_tokens(prefill_tokens: int, decode_reqs: int, spec_tokens: int) -> int:
    """New tokens in the forward pass: the GEMMs' batch dimension."""
    return prefill_tokens + decode_reqs + spec_tokens


def spec_steps(decode_reqs: int, spec_tokens: int) -> int:
    """Draft steps behind `spec_tokens` verified tokens, assuming an even depth per request
    (SLOs-Serve's #SpecStep: the draft model runs that many sequential steps)."""
    if spec_tokens <= 0:
        return 0
    return math.ceil(spec_tokens / max(decode_reqs, 1))


def largest_fitting(fits: Callable[[int], bool], limit: int) -> int:
    """Largest n in [1, limit] with fits(n), for fits true up to some n and false beyond
    (step time never falls as a batch grows); 0 if not even n = 1 fits. Doubling first keeps
    small answers cheap against a large limit."""
    if limit < 1 or not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)  # hi never fits (or is past the limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def settle(fits: Callable[[int], bool], guess: int, limit: int) -> int:
    """`largest_fitting(fits, limit)` from a close guess: a few steps to the boundary, checked
    on both sides (for fits true up to some n and false beyond); far off, the search decides."""
    n = max(0, min(guess, limit))
    for _ in range(8):
        if n >= 1 and not fits(n):
            n -= 1
        elif n < limit and fits(n + 1):
            n += 1
        else:
            return n
    return largest_fitting(fits, limit)


class StepTimeModel(ABC):
    """A step-time model: subclasses give `step_time`, the inverses here follow from it."""

    @abstractmethod
    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        """Seconds for one forward pass (see `PerfModel.step_time`)."""

    def max_batch_within(
        self,
        budget_s: float,
        kv_tokens_per_req: float,
        prefill_tokens: int = 0,
        spec_tokens_per_req: int = 0,
        extra_kv_tokens: int = 0,
        limit: int = MAX_BATCH_LIMIT,
    ) -> int:
        """Largest decode batch n ≤ `limit` whose iteration (n requests of `kv_tokens_per_req`
        context each, plus a `prefill_tokens` chunk attending `extra_kv_tokens`) fits `budget_s`;
        0 if not even one request fits."""

        def fits(n: int) -> bool:
            kv = int(round(n * kv_tokens_per_req)) + extra_kv_tokens
            return self.step_time(prefill_tokens, n, kv, n * spec_tokens_per_req) <= budget_s

        guess = self._batch_guess(budget_s, kv_tokens_per_req, prefill_tokens, spec_tokens_per_req, extra_kv_tokens)
        return largest_fitting(fits, limit) if guess is None or limit < 1 else settle(fits, guess, limit)

    def max_chunk_within(self, budget_s: float, decode_reqs: int, kv_tokens: int, limit: int) -> int:
        """Largest prefill chunk c ≤ `limit` whose iteration beside `decode_reqs` decodes
        attending `kv_tokens` (the chunk attends itself too: kv_tokens + c) fits `budget_s`;
        0 if not even one token fits."""

        def fits(chunk: int) -> bool:
            return self.step_time(chunk, decode_reqs, kv_tokens + chunk) <= budget_s

        guess = self._chunk_guess(budget_s, decode_reqs, kv_tokens)
        return largest_fitting(fits, limit) if guess is None or limit < 1 else settle(fits, guess, limit)

    def _batch_guess(
        self, budget_s: float, kv_tokens_per_req: float, prefill_tokens: int, spec_tokens_per_req: int, extra_kv: int
    ) -> int | None:
        """A model that can solve for the largest batch says where the boundary is (then it is
        only checked); None: it is searched for."""
        return None

    def _chunk_guess(self, budget_s: float, decode_reqs: int, kv_tokens: int) -> int | None:
        """As `_batch_guess`, for the largest prefill chunk."""
        return None


# ---------------------------------------------------------------- roofline (SLOs-Serve §3.1.1)

# Feature scales: the online update works in units where every feature is O(1), so one step
# size suits tokens (~1e3), draft steps (~1), KV tokens (~1e5) and the constant alike.
_FEATURE_SCALE = np.array([1024.0, 4.0, 65536.0, 1.0, 64.0])


@dataclass(frozen=True)
class RooflineTerm:
    """One bottleneck: seconds per new token, per draft step, per KV token, plus a constant;
    and, beyond SLOs-Serve's form, seconds per decoding sequence (`k_seqs`, default 0): engines
    with per-sequence work (CPU attention loops, per-request sampling) cost more for 8 decodes
    than for 8 prefill tokens, which a tokens-only roofline cannot tell apart in mixed batches."""

    k_tokens: float
    k_spec: float
    k_kv: float
    b: float
    k_seqs: float = 0.0

    def as_array(self) -> np.ndarray:
        return np.array([self.k_tokens, self.k_spec, self.k_kv, self.b, self.k_seqs], dtype=float)


def _features(prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int) -> np.ndarray:
    return np.array(
        [
            batch_tokens(prefill_tokens, decode_reqs, spec_tokens),
            spec_steps(decode_reqs, spec_tokens),
            kv_tokens,
            1.0,
            decode_reqs,
        ],
        dtype=float,
    )


def _nnls(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Exact weighted non-negative least squares for a handful of columns: try every support."""
    sw = np.sqrt(w)
    xw, yw = x * sw[:, None], y * sw
    best, best_err = np.zeros(x.shape[1]), float(np.sum(yw**2))
    live = [c for c in range(x.shape[1]) if np.any(x[:, c] != 0)]  # an unused feature stays at 0
    for size in range(1, len(live) + 1):
        for cols in itertools.combinations(live, size):
            coef, *_ = np.linalg.lstsq(xw[:, cols], yw, rcond=None)
            if np.any(coef < 0):
                continue
            err = float(np.sum((xw[:, cols] @ coef - yw) ** 2))
            if err < best_err - 1e-18:
                best = np.zeros(x.shape[1])
                best[list(cols)] = coef
                best_err = err
    return best


def _max_affine_error(terms: Sequence[np.ndarray], x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    predicted = np.max(x @ np.stack(terms).T, axis=1)
    return float(np.sum(w * (predicted - y) ** 2))


def _prune_terms(
    terms: list[np.ndarray], x: np.ndarray, y: np.ndarray, w: np.ndarray, tolerance: float = 1e-9
) -> list[np.ndarray]:
    """Drop terms the fit is no worse without, and fall back to one term over all samples when
    that fits better. Max-affine regression can leave a term fitted to a handful of samples
    that overshoots every other one (collinear features, e.g. decode-only iterations where
    tokens = sequences, break its ties by rounding noise: measured, a 5x prediction error on one
    host and none on another); the max then picks that term everywhere."""
    terms = list(terms)
    err = _max_affine_error(terms, x, y, w)
    while len(terms) > 1:
        trials = [(_max_affine_error(terms[:i] + terms[i + 1 :], x, y, w), i) for i in range(len(terms))]
        best_err, drop = min(trials)
        if best_err > err * (1.0 + tolerance) + 1e-30:
            break
        terms.pop(drop)
        err = best_err
    single = _nnls(x, y, w)
    if np.any(single > 0) and _max_affine_error([single], x, y, w) < err * (1.0 - tolerance):
        return [single]
    return terms


class RooflinePerfModel(StepTimeModel):
    """T = max over terms of (k_tokens·#tokens + k_spec·#spec + k_kv·#kv + b + k_seqs·#decodes), ≥ 0."""

    def __init__(self, terms: Sequence[RooflineTerm], step_size: float = 0.5) -> None:
        if not terms:
            raise ValueError("a roofline model needs at least one term")
        if not 0 < step_size < 2:
            raise ValueError("step_size must lie in (0, 2) for the online update to converge")
        self._theta = np.stack([t.as_array() for t in terms])  # (L, 5), natural units
        self._sync_terms()
        self.step_size = step_size

    def _sync_terms(self) -> None:
        # Plain float tuples for step_time: policies call it thousands of times per plan, where
        # numpy's per-call overhead on a 5-vector would dominate.
        self._rows = [(t.b, t.k_tokens, t.k_spec, t.k_kv, t.k_seqs) for t in self.terms]
        # No term falls as a batch or chunk grows: the largest one within a budget is then
        # each term's line solved for it (`_within`), checked against step_time at the boundary.
        self._rising = bool(np.all(self._theta >= 0.0))

    def _within(self, budget_s: float, lines: Sequence[tuple[float, float]]) -> int:
        """The largest n with intercept + slope·n ≤ budget on every (intercept, slope), as far
        as floats say (settle checks it), capped far above any batch or chunk."""
        best = float(1 << 40)
        for intercept, slope in lines:
            room = budget_s - intercept
            if slope > 0.0:
                best = min(best, room / slope)
            elif room < 0.0:
                return 0
        return int(math.floor(best)) if best >= 1.0 else 0

    def _batch_guess(
        self, budget_s: float, kv_tokens_per_req: float, prefill_tokens: int, spec_tokens_per_req: int, extra_kv: int
    ) -> int | None:
        if not self._rising:
            return None
        s = spec_tokens_per_req
        steps = s if s > 0 else 0  # spec_steps(n, n·s) for every n ≥ 1
        return self._within(
            budget_s,
            [
                (
                    b + k_tokens * prefill_tokens + k_spec * steps + k_kv * extra_kv,
                    k_tokens * (1 + s) + k_kv * kv_tokens_per_req + k_seqs,
                )
                for b, k_tokens, k_spec, k_kv, k_seqs in self._rows
            ],
        )

    def _chunk_guess(self, budget_s: float, decode_reqs: int, kv_tokens: int) -> int | None:
        if not self._rising:
            return None
        return self._within(
            budget_s,
            [
                (b + k_tokens * decode_reqs + k_kv * kv_tokens + k_seqs * decode_reqs, k_tokens + k_kv)
                for b, k_tokens, _, k_kv, k_seqs in self._rows
            ],
        )

    @property
    def terms(self) -> list[RooflineTerm]:
        return [RooflineTerm(*map(float, row)) for row in self._theta]

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        tokens = prefill_tokens + decode_reqs + spec_tokens  # batch_tokens, inlined: a hot path
        if tokens <= 0:
            return 0.0  # an empty batch is no forward pass
        steps = spec_steps(decode_reqs, spec_tokens) if spec_tokens > 0 else 0
        slowest = 0.0
        for b, k_tokens, k_spec, k_kv, k_seqs in self._rows:
            # summed constant first, as a one-term model's closed form reads: its times stay exact
            t = b + k_tokens * tokens + k_spec * steps + k_kv * kv_tokens + k_seqs * decode_reqs
            if t > slowest:
                slowest = t
        return slowest

    def observe(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, measured_s: float
    ) -> None:
        """Normalised-LMS step on the bottleneck term at this point (a bounded-gain cousin of
        recursive least squares without its covariance wind-up); coefficients stay ≥ 0 so the
        model stays monotone. Repeating one point shrinks its error by (1 - step_size) per call."""
        x = _features(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)
        if x[0] <= 0 or not math.isfinite(measured_s) or measured_s < 0:
            return
        active = int(np.argmax(self._theta @ x))
        z = x / _FEATURE_SCALE  # scaled features; scaled coefficients are theta * scale
        err = measured_s - float(self._theta[active] @ x)
        delta_scaled = self.step_size * err * z / float(z @ z)
        self._theta[active] = np.maximum(self._theta[active] + delta_scaled / _FEATURE_SCALE, 0.0)
        self._sync_terms()

    @classmethod
    def fit(cls, samples: Sequence[Sample], n_terms: int = 2, iterations: int = 50) -> RooflinePerfModel:
        """Max-affine regression: split samples by token count, fit each term by non-negative
        least squares (relative error), reassign each sample to its bottleneck term, repeat."""
        if len(samples) < 4 * n_terms:
            raise ValueError(f"need at least {4 * n_terms} samples to fit {n_terms} terms")
        x = np.stack([_features(s.prefill_tokens, s.decode_reqs, s.kv_tokens, s.spec_tokens) for s in samples])
        y = np.array([s.time_s for s in samples], dtype=float)
        if np.any(y <= 0):
            raise ValueError("sample times must be positive")
        w = 1.0 / y**2  # relative error: small-batch iterations matter as much as big ones
        order = np.argsort(x[:, 0], kind="stable")
        groups = np.empty(len(y), dtype=int)
        for g, idx in enumerate(np.array_split(order, n_terms)):
            groups[idx] = g
        theta = np.zeros((n_terms, len(_FEATURE_SCALE)))
        for _ in range(iterations):
            for g in range(n_terms):
                mask = groups == g
                if mask.sum() >= 2:
                    theta[g] = _nnls(x[mask], y[mask], w[mask])
            new_groups = np.argmax(x @ theta.T, axis=1)
            if np.array_equal(new_groups, groups):
                break
            groups = new_groups
        keep = _prune_terms([row for row in theta if np.any(row > 0)] or [theta[0]], x, y, w)
        return cls([RooflineTerm(*map(float, row)) for row in keep])

    def to_dict(self) -> dict[str, Any]:
        return {"terms": [asdict(t) for t in self.terms]}

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> RooflinePerfModel:
        return cls([RooflineTerm(**{k: float(v) for k, v in t.items()}) for t in section["terms"]])

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | str | Path) -> RooflinePerfModel:
        """The profile's fitted terms, or a fit of its `samples` when it has no terms."""
        profile = _as_profile(profile)
        if "roofline" in profile:
            return cls.from_dict(profile["roofline"])
        if profile.get("samples"):
            return cls.fit(samples_from_profile(profile))
        raise ValueError("profile has neither a 'roofline' section nor 'samples' to fit one")


# ---------------------------------------------------------------- one-term rooflines


@dataclass(frozen=True)
class LinearCoefficients:
    """An affine step time: base + per_token·(prefill + decode + spec tokens) + per_seq·decodes
    + per_kv_token·KV tokens + per_spec_step·draft steps. `per_seq_s` is what a decode costs
    beyond its one token (per-request sampling, attention launches)."""

    base_s: float
    per_token_s: float
    per_seq_s: float = 0.0
    per_kv_token_s: float = 0.0
    per_spec_step_s: float = 0.0

    def model(self) -> RooflinePerfModel:
        term = RooflineTerm(
            k_tokens=self.per_token_s,
            k_spec=self.per_spec_step_s,
            k_kv=self.per_kv_token_s,
            b=self.base_s,
            k_seqs=self.per_seq_s,
        )
        return RooflinePerfModel([term])


# The one set of numbers for "no perf model given": rough figures for a small model on one GPU
# (8 ms per pass, 60 µs per token, 150 µs per decode all told), only so policies can rank
# before anything is measured; replace with a profile or let the online model learn.
DEFAULT_COEFFICIENTS = LinearCoefficients(base_s=0.008, per_token_s=6e-5, per_seq_s=9e-5, per_kv_token_s=2e-8)


def linear_model(
    base_s: float,
    per_token_s: float,
    per_seq_s: float = 0.0,
    per_kv_token_s: float = 0.0,
    per_spec_step_s: float = 0.0,
) -> RooflinePerfModel:
    """The one-term roofline of these coefficients (see `LinearCoefficients`)."""
    return LinearCoefficients(base_s, per_token_s, per_seq_s, per_kv_token_s, per_spec_step_s).model()


def constant_model(step_s: float) -> RooflinePerfModel:
    """Every (non-empty) iteration takes exactly `step_s`: exact arithmetic for constructed schedules."""
    return linear_model(base_s=step_s, per_token_s=0.0)


def default_model() -> RooflinePerfModel:
    """The model for "no perf model given" (`DEFAULT_COEFFICIENTS`), a fresh one each call:
    a model may learn online, so callers must not share it."""
    return DEFAULT_COEFFICIENTS.model()


# ---------------------------------------------------------------- table (PolyServe §4.5)


def _axis_position(axis: Sequence[float], value: float) -> tuple[int, float]:
    """Left cell index and fractional position; t outside [0, 1] extrapolates linearly. Plain
    Python on a list: a simulator asks this hundreds of thousands of times per run."""
    if len(axis) == 1:
        return 0, 0.0
    i = min(max(bisect.bisect_right(axis, value) - 1, 0), len(axis) - 2)
    return i, (value - axis[i]) / (axis[i + 1] - axis[i])


class TablePerfModel(StepTimeModel):
    """time(batch_tokens, kv_tokens) from a profiled grid; batch tokens = prefill + decode + spec.

    PolyServe drops prefill attention from the prediction (small next to GEMMs and decode
    attention for chunked prefill under ~10K context); so does this table.
    """

    def __init__(
        self,
        batch_axis: Sequence[float],
        kv_axis: Sequence[float],
        time_s: Sequence[Sequence[float]],
        step_size: float = 0.5,
    ) -> None:
        self.batch_axis = np.asarray(batch_axis, dtype=float)
        self.kv_axis = np.asarray(kv_axis, dtype=float)
        self.time_s = np.array(time_s, dtype=float)
        if self.time_s.shape != (len(self.batch_axis), len(self.kv_axis)):
            raise ValueError(f"time_s must be {len(self.batch_axis)}x{len(self.kv_axis)}, got {self.time_s.shape}")
        for name, axis in (("batch_tokens", self.batch_axis), ("kv_tokens", self.kv_axis)):
            if len(axis) == 0 or np.any(np.diff(axis) <= 0):
                raise ValueError(f"{name} axis must be non-empty and strictly increasing")
        if not 0 < step_size < 2:
            raise ValueError("step_size must lie in (0, 2) for the online update to converge")
        self.step_size = step_size
        self._batch_list: list[float] = self.batch_axis.tolist()
        self._kv_list: list[float] = self.kv_axis.tolist()
        self._rows_cache: list[list[float]] | None = None

    def _corners(self, b: float, k: float) -> list[tuple[int, int, float]]:
        i, tb = _axis_position(self._batch_list, b)
        j, tk = _axis_position(self._kv_list, k)
        wb = [(i, 1.0 - tb), (i + 1, tb)] if len(self.batch_axis) > 1 else [(0, 1.0)]
        wk = [(j, 1.0 - tk), (j + 1, tk)] if len(self.kv_axis) > 1 else [(0, 1.0)]
        return [(bi, kj, w1 * w2) for bi, w1 in wb for kj, w2 in wk]

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        b = batch_tokens(prefill_tokens, decode_reqs, spec_tokens)
        if b <= 0:
            return 0.0
        rows = self._rows
        value = sum(w * rows[i][j] for i, j, w in self._corners(b, kv_tokens))
        return max(float(value), 0.0)

    @property
    def _rows(self) -> list[list[float]]:
        """time_s as nested lists, rebuilt only after the grid changed (observe)."""
        if self._rows_cache is None:
            self._rows_cache = self.time_s.tolist()
        return self._rows_cache

    def observe(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, measured_s: float
    ) -> None:
        """Normalised LMS on the grid nodes that produced this prediction: the prediction here
        moves `step_size` of the way to the measurement; far-away cells are untouched."""
        b = batch_tokens(prefill_tokens, decode_reqs, spec_tokens)
        if b <= 0 or not math.isfinite(measured_s) or measured_s < 0:
            return
        corners = self._corners(b, kv_tokens)
        err = measured_s - sum(w * self.time_s[i, j] for i, j, w in corners)
        norm = sum(w * w for _, _, w in corners)
        if norm <= 0:
            return
        for i, j, w in corners:
            self.time_s[i, j] += self.step_size * err * w / norm
        self._rows_cache = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_tokens": self.batch_axis.tolist(),
            "kv_tokens": self.kv_axis.tolist(),
            "time_s": self.time_s.tolist(),
        }

    @classmethod
    def from_dict(cls, section: Mapping[str, Any]) -> TablePerfModel:
        return cls(section["batch_tokens"], section["kv_tokens"], section["time_s"])

    @classmethod
    def from_profile(cls, profile: Mapping[str, Any] | str | Path) -> TablePerfModel:
        profile = _as_profile(profile)
        if "table" not in profile:
            raise ValueError("profile has no 'table' section")
        return cls.from_dict(profile["table"])


# ---------------------------------------------------------------- profile files


def profile_path(gpu: str, model: str = "llama3-8b") -> Path:
    """Where a shipped profile lives, e.g. profile_path("h100") → .../profiles/h100-llama3-8b.json."""
    return PROFILE_DIR / f"{gpu.lower()}-{model.lower()}.json"


def load_profile(path: str | Path) -> dict[str, Any]:
    with open(path, encoding="utf-8") as fh:
        profile = json.load(fh)
    if not isinstance(profile, dict) or profile.get("format") != PROFILE_FORMAT:
        raise ValueError(f"{path}: not a perf profile (expected format {PROFILE_FORMAT!r})")
    return profile


def save_profile(profile: Mapping[str, Any], path: str | Path) -> None:
    data = {"format": PROFILE_FORMAT, **profile}
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def samples_from_profile(profile: Mapping[str, Any]) -> list[Sample]:
    return [
        Sample(
            int(s["prefill_tokens"]),
            int(s["decode_reqs"]),
            int(s["kv_tokens"]),
            int(s.get("spec_tokens", 0)),
            float(s["time_s"]),
        )
        for s in profile.get("samples", [])
    ]


def _as_profile(profile: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    return load_profile(profile) if isinstance(profile, (str, Path)) else profile


def load_perf_model(profile: Mapping[str, Any] | str | Path, kind: str = "table") -> RooflinePerfModel | TablePerfModel:
    """A model from a profile file or dict; `kind` is "table" (PolyServe) or "roofline" (SLOs-Serve)."""
    if kind == "table":
        return TablePerfModel.from_profile(profile)
    if kind == "roofline":
        return RooflinePerfModel.from_profile(profile)
    raise ValueError(f"unknown perf model kind {kind!r} (table | roofline)")
