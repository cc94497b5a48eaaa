"""The engine's own performance model, learned from the iterations it measures.

A real engine (or a GPU we have no profile for) starts with no model; a bad prior would make
batch caps silly, so the model is `ready` only after enough measured iterations. It refits
SLOs-Serve's roofline from a window of recent samples and tracks drift with the roofline's
online update between refits.

A refit costs tens of milliseconds of the scheduler's own thread. On an engine with short steps
(the tiny model: ~10 ms) refitting every 64 steps took 5-8 % of the scheduler's time, so refits
also respect a duty cycle: after a fit that took f seconds, the next waits f / `fit_budget`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from scheduler.core.perf_model import (
    PerfModel,
    RooflinePerfModel,
    Sample,
    StepTimeModel,
    default_model,
    prefill_step_times,
)


class OnlinePerfModel(StepTimeModel):
    def __init__(
        self,
        prior: PerfModel | None = None,
        min_samples: int = 32,
        window: int = 512,
        refit_every: int = 64,
        n_terms: int = 2,
        max_error: float = 1.0,
        fit_budget: float = 0.01,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not 0.0 < fit_budget <= 1.0:
            raise ValueError(f"fit_budget must be in (0, 1], got {fit_budget}")
        self.max_error = max_error
        self.fit_budget = fit_budget  # the share of the scheduler's time refits may take
        self._timer = timer
        self._next_fit_at = -float("inf")
        self.fits = 0
        self.model: PerfModel = prior if prior is not None else default_model()
        self._trusted_prior = prior is not None  # a given profile: used as is, never refitted
        self.samples: deque[Sample] = deque(maxlen=window)
        self.min_samples = max(min_samples, 4 * n_terms)
        self.refit_every = refit_every
        self.n_terms = n_terms
        self._since_fit = 0
        self.observed = 0
        self._abs_rel_err: deque[float] = deque(maxlen=256)

    @property
    def ready(self) -> bool:
        """Trustworthy enough to cap batches: a given profile, or enough measured iterations
        predicted within `max_error` (a noisy host's mispredictions would throttle for nothing)."""
        if self._trusted_prior:
            return True
        error = self.recent_error()
        return self.observed >= self.min_samples and error is not None and error <= self.max_error

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.model.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)

    def prefill_step_times(self, prefill_tokens: np.ndarray, decode_reqs: int, kv_tokens: int) -> np.ndarray:
        return prefill_step_times(self.model, prefill_tokens, decode_reqs, kv_tokens)

    def observe(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, measured_s: float
    ) -> None:
        if measured_s <= 0 or prefill_tokens + decode_reqs + spec_tokens <= 0:
            return
        predicted = self.model.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)
        self._abs_rel_err.append(abs(predicted - measured_s) / measured_s)
        self.observed += 1
        if self._trusted_prior:
            return  # measure the error against the profile, but keep it
        assert isinstance(self.model, RooflinePerfModel)  # the default prior or a refit
        self.samples.append(Sample(prefill_tokens, decode_reqs, kv_tokens, spec_tokens, measured_s))
        self._since_fit += 1
        self.model.observe(prefill_tokens, decode_reqs, kv_tokens, spec_tokens, measured_s)
        first_fit = self.observed == self.min_samples
        due = self._since_fit >= self.refit_every and self._timer() >= self._next_fit_at
        if len(self.samples) >= self.min_samples and (first_fit or due):
            started = self._timer()
            try:
                self.model = RooflinePerfModel.fit(list(self.samples), n_terms=self.n_terms)
                self._since_fit = 0
                self.fits += 1
            except ValueError:
                pass  # degenerate window (e.g. all samples identical): keep the current model
            ended = self._timer()
            self._next_fit_at = ended + (ended - started) / self.fit_budget

    def recent_error(self) -> float | None:
        """Mean |predicted − measured| / measured over recent iterations."""
        if not self._abs_rel_err:
            return None
        return sum(self._abs_rel_err) / len(self._abs_rel_err)
