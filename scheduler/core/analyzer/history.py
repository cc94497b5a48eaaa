"""History baseline: what this app's recent answers looked like, with no text model at all.

It is the yardstick the learned predictors must beat, and a cold-start fallback when no trained
artifact is loaded. It keeps a bounded window of recent output lengths per app (and globally)
and answers their mean or a quantile; once a request has generated g tokens it conditions on
past answers longer than g, which gives a cheap refinement of the same kind the QRF does. The
apps it remembers are bounded too (least recently seen forgotten first): every fresh program_id
is an app, and a server lives through millions of them.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from scheduler.core.analyzer.base import LengthPredictor, LengthSample, floor_at_generated
from scheduler.core.registry import require


@dataclass(frozen=True)
class HistoryParams:
    quantile: float | None = None  # None: the mean
    window: int = 1000  # recent answers kept per app and globally
    min_count: int = 20  # an app's answers needed before its own history is used
    default: float = 256.0
    min_global: int = 1  # answers fewer than this: `default` (a cold start's first answers are the short ones)
    max_apps: int = 10_000  # apps remembered (least recently seen forgotten first)

    def __post_init__(self) -> None:
        ok = self.quantile is None or 0.0 < self.quantile < 1.0
        require(ok, "quantile", "must be in (0, 1) or None for the mean", self.quantile)
        require(self.max_apps >= 1, "max_apps", "must be >= 1", self.max_apps)


class HistoryPredictor(LengthPredictor):
    name = "history"

    def __init__(self, params: HistoryParams = HistoryParams()) -> None:
        self.quantile = params.quantile
        self.window = params.window
        self.min_count = params.min_count
        self.default = params.default
        self.min_global = params.min_global
        self.max_apps = params.max_apps
        self._per_app: OrderedDict[str, deque[int]] = OrderedDict()
        self._global: deque[int] = deque(maxlen=params.window)

    def __setstate__(self, state: dict) -> None:
        """Artifacts pickled before the app bound existed load with one."""
        state.setdefault("max_apps", HistoryParams.max_apps)
        state["_per_app"] = OrderedDict(state.get("_per_app", {}))
        self.__dict__.update(state)

    def observe(self, app_id: str | None, output_len: int) -> None:
        """Record one finished request (online: the adapter calls this on completion)."""
        self._global.append(int(output_len))
        if app_id:
            pool = self._per_app.get(app_id)
            if pool is None:
                pool = self._per_app[app_id] = deque(maxlen=self.window)
                while len(self._per_app) > self.max_apps:
                    self._per_app.popitem(last=False)
            else:
                self._per_app.move_to_end(app_id)
            pool.append(int(output_len))

    def fit(self, samples: Sequence[LengthSample]) -> HistoryPredictor:
        for s in samples:
            self.observe(s.app_id, s.output_len)
        return self

    def _stat(self, values: np.ndarray) -> float:
        if self.quantile is None:
            return float(values.mean())
        return float(np.quantile(values, self.quantile))

    def predict(
        self,
        prompt_text: str = "",
        prompt_len: int = 0,
        app_id: str | None = None,
        generated: int = 0,
        generated_text: str = "",
    ) -> float:
        for pool in (self._per_app.get(app_id or "", ()), self._global):
            values = np.fromiter(pool, dtype=float)
            values = values[values > generated]
            if len(values) >= self.min_count or (pool is self._global and len(values) >= max(1, self.min_global)):
                return floor_at_generated(self._stat(values), generated)
        return floor_at_generated(self.default, generated)
