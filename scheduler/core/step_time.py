"""What every step-time model shares: the `PerfModel` protocol policies call, one measured
iteration (`Sample`), and `StepTimeModel`, which answers the inverse questions (the largest
decode batch, the largest prefill chunk within a time budget) from a member's own forward
`step_time`. The family's members and its front door are in perf_model.py."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

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


def prefill_step_times(perf: PerfModel, prefill_tokens: np.ndarray, decode_reqs: int, kv_tokens: int) -> np.ndarray:
    """`perf.step_time(p, decode_reqs, kv_tokens)` for each p: in one array operation where the
    model has one (`prefill_step_times`, the same values), else one call per distinct p."""
    at_once = getattr(perf, "prefill_step_times", None)
    if at_once is not None:
        return np.asarray(at_once(prefill_tokens, decode_reqs, kv_tokens), dtype=np.float64)
    sizes, at = np.unique(prefill_tokens, return_inverse=True)
    times = np.array([perf.step_time(p, decode_reqs, kv_tokens) for p in sizes.tolist()], dtype=np.float64)
    return times[at.reshape(prefill_tokens.shape)]


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

    def max_prefill_within(
        self, budget_s: float, decode_reqs: int, kv_tokens: int, spec_tokens: int, limit: int
    ) -> int:
        """Largest count of prefill tokens ≤ `limit` whose iteration beside `decode_reqs` decodes
        attending `kv_tokens` (not growing with the prefill) fits `budget_s`; 0 if not even one
        token fits. SLOs-Serve's DP asks it for every batch shape it tries."""

        def fits(tokens: int) -> bool:
            return self.step_time(tokens, decode_reqs, kv_tokens, spec_tokens) <= budget_s

        guess = self._prefill_guess(budget_s, decode_reqs, kv_tokens, spec_tokens)
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

    def _prefill_guess(self, budget_s: float, decode_reqs: int, kv_tokens: int, spec_tokens: int) -> int | None:
        """As `_batch_guess`, for the most prefill tokens at a fixed KV count."""
        return None
