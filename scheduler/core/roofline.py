"""The roofline step-time model (SLOs-Serve §3.1.1): T = max_l(k1_l·#tokens + k2_l·#spec +
k_kv_l·#KV + b_l), fitted by non-negative regression and pruned to the terms that matter, and
learned online from measured iterations. See perf_model.py for the family."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from scheduler.core.perf_profiles import as_profile, samples_from_profile
from scheduler.core.step_time import Sample, StepTimeModel, batch_tokens, spec_steps

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
    tokens = sequences, break its ties by rounding noise, so the fit differs between hosts); the
    max then picks that term everywhere."""
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

    def _prefill_guess(self, budget_s: float, decode_reqs: int, kv_tokens: int, spec_tokens: int) -> int | None:
        if not self._rising:
            return None
        steps = spec_steps(decode_reqs, spec_tokens) if spec_tokens > 0 else 0
        return self._within(
            budget_s,
            [
                (
                    b
                    + k_tokens * (decode_reqs + spec_tokens)
                    + k_spec * steps
                    + k_kv * kv_tokens
                    + k_seqs * decode_reqs,
                    k_tokens,
                )
                for b, k_tokens, k_spec, k_kv, k_seqs in self._rows
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

    def prefill_step_times(self, prefill_tokens: np.ndarray, decode_reqs: int, kv_tokens: int) -> np.ndarray:
        """`step_time(p, decode_reqs, kv_tokens)` for every p at once, bit for bit (the same
        sums in the same order): a deep queue asks for hundreds of chunk sizes per pass."""
        tokens = prefill_tokens.astype(np.float64) + decode_reqs
        slowest = np.zeros_like(tokens)
        for b, k_tokens, _, k_kv, k_seqs in self._rows:  # no spec tokens: step_time adds an exact 0 there
            np.maximum(slowest, b + k_tokens * tokens + k_kv * kv_tokens + k_seqs * decode_reqs, out=slowest)
        slowest[tokens <= 0] = 0.0
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
        profile = as_profile(profile)
        if "roofline" in profile:
            return cls.from_dict(profile["roofline"])
        if profile.get("samples"):
            return cls.fit(samples_from_profile(profile))
        raise ValueError("profile has neither a 'roofline' section nor 'samples' to fit one")
