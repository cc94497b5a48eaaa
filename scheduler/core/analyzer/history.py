"""History baseline: what this app's recent answers looked like, with no text model at all.

It is the yardstick the learned predictors must beat, and a cold-start fallback when no trained
artifact is loaded. It keeps a bounded window of recent output lengths per app (and globally)
and answers their mean or a quantile; once a request has generated g tokens it conditions on
past answers longer than g, which gives a cheap refinement of the same kind the QRF does. The
apps it remembers are bounded too (least recently seen forgotten first): every fresh program_id
is an app, and a server lives through millions of them.

With `by_prompt_len` it also keeps a window per prompt-length band (half an octave wide) and
asks it before the global one. The prompt's length is the one feature a text-blind server
always has (our QRF's features include it too): in the Azure conversation trace the 90th
percentile of answers is 130 tokens for 363–511-token prompts and 468 for 1024–1448-token
ones, against 424 over all (answers capped at 512 tokens, as the benchmarks run them).
"""

from __future__ import annotations

import bisect
import math
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from scheduler.core.analyzer.base import LengthPredictor, LengthSample
from scheduler.core.registry import require


@dataclass(frozen=True)
class HistoryParams:
    quantile: float | None = None  # None: the mean
    window: int = 1000  # recent answers kept per app and globally
    min_count: int = 20  # an app's answers needed before its own history is used
    default: float = 256.0
    min_global: int = 1  # answers fewer than this: `default` (a cold start's first answers are the short ones)
    max_apps: int = 10_000  # apps remembered (least recently seen forgotten first)
    by_prompt_len: bool = False  # also condition on the prompt's length band

    def __post_init__(self) -> None:
        ok = self.quantile is None or 0.0 < self.quantile < 1.0
        require(ok, "quantile", "must be in (0, 1) or None for the mean", self.quantile)
        require(self.max_apps >= 1, "max_apps", "must be >= 1", self.max_apps)


def linear_quantile(ordered: Sequence[float], q: float, start: int = 0) -> float:
    """numpy.quantile(ordered[start:], q) (its default "linear" method), bit for bit, on values
    already sorted: the same virtual index, neighbours and lerp numpy computes, without the
    array round trip that dominated a router decision."""
    n = len(ordered) - start
    virtual = (n - 1) * q  # numpy's virtual index for "linear"
    if virtual >= n - 1:
        return float(ordered[-1])
    if virtual < 0:
        return float(ordered[start])
    below = math.floor(virtual)
    gamma = virtual - below
    a, b = float(ordered[start + below]), float(ordered[start + below + 1])
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


class _Window:
    """The last `size` answers, in arrival order (to forget the oldest) and sorted (to answer)."""

    def __init__(self, size: int) -> None:
        self.recent: deque[int] = deque()
        self.ordered: list[int] = []
        self.size = size

    def add(self, value: int) -> None:
        if len(self.recent) >= self.size:
            old = self.recent.popleft()
            del self.ordered[bisect.bisect_left(self.ordered, old)]
        self.recent.append(value)
        bisect.insort(self.ordered, value)

    def __len__(self) -> int:
        return len(self.recent)

    def __iter__(self) -> Iterator[int]:
        return iter(self.recent)


def _as_window(values: object, size: int) -> _Window:
    """A window from a pickled one, or from the plain deque artifacts held before windows sorted."""
    if isinstance(values, _Window):
        return values
    window = _Window(size)
    for v in values:  # type: ignore[attr-defined]
        window.add(int(v))
    return window


def prompt_len_band(prompt_len: int) -> int:
    """Half-octave band of a prompt length: 363–511 tokens is one band, 512–724 the next."""
    return int(math.floor(2.0 * math.log2(max(int(prompt_len), 1))))


class HistoryPredictor(LengthPredictor):
    name = "history"

    def __init__(self, params: HistoryParams = HistoryParams()) -> None:
        self.quantile = params.quantile
        self.window = params.window
        self.min_count = params.min_count
        self.default = params.default
        self.min_global = params.min_global
        self.max_apps = params.max_apps
        self.by_prompt_len = params.by_prompt_len
        self._per_app: OrderedDict[str, _Window] = OrderedDict()
        self._per_band: dict[int, _Window] = {}  # at most ~2 log2(context) bands: no bound needed
        self._global = _Window(params.window)

    def __setstate__(self, state: dict) -> None:
        """Artifacts pickled before the app bound existed load with one."""
        state.setdefault("max_apps", HistoryParams.max_apps)
        state.setdefault("by_prompt_len", False)
        state.setdefault("_per_band", {})
        window = state.get("window", HistoryParams.window)
        state["_per_app"] = OrderedDict((app, _as_window(v, window)) for app, v in state.get("_per_app", {}).items())
        state["_global"] = _as_window(state.get("_global", ()), window)
        self.__dict__.update(state)

    def observe(self, app_id: str | None, output_len: int, prompt_len: int | None = None) -> None:
        """Record one finished request (online: the adapter calls this on completion)."""
        self._global.add(int(output_len))
        if self.by_prompt_len and prompt_len is not None:
            band = prompt_len_band(prompt_len)
            window = self._per_band.get(band)
            if window is None:
                window = self._per_band[band] = _Window(self.window)
            window.add(int(output_len))
        if app_id:
            window = self._per_app.get(app_id)
            if window is None:
                window = self._per_app[app_id] = _Window(self.window)
                while len(self._per_app) > self.max_apps:
                    self._per_app.popitem(last=False)
            else:
                self._per_app.move_to_end(app_id)
            window.add(int(output_len))

    def fit(self, samples: Sequence[LengthSample]) -> HistoryPredictor:
        for s in samples:
            self.observe(s.app_id, s.output_len, s.prompt_len)
        return self

    def _stat(self, ordered: list[int], start: int) -> float:
        """Mean or quantile of ordered[start:] (numpy's values, computed on the sorted window)."""
        if self.quantile is None:
            return float(sum(ordered[start:])) / (len(ordered) - start)
        return linear_quantile(ordered, self.quantile, start)

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        app = self._per_app.get(app_id or "")
        band = self._per_band.get(prompt_len_band(prompt_len)) if self.by_prompt_len else None
        for pool in (app, band, self._global):
            if pool is None:
                continue
            start = bisect.bisect_right(pool.ordered, generated)  # answers longer than what is out
            count = len(pool.ordered) - start
            if count >= self.min_count or (pool is self._global and count >= max(1, self.min_global)):
                return self._stat(pool.ordered, start)
        return self.default
