"""Length bounds for live requests: predicted at arrival, refined every N generated tokens.

Predictors cost milliseconds per call, far too much to run per request per scheduling step,
so each request's bound is cached and recomputed only when its generated count crosses the
next refinement checkpoint (Tempo/JITServe §4.1).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.core.analyzer.base import LengthPredictor, floor_at_generated


def learns_online(predictor: object) -> bool:
    """Whether completions teach this predictor (the history predictor); trained artifacts are fixed."""
    return callable(getattr(predictor, "observe", None))


@dataclass
class _Entry:
    checkpoint: int
    bound: float
    initial: float
    prompt_text: str
    prompt_len: int


class LiveLengthBounds:
    def __init__(self, predictor: LengthPredictor, refine_every: int | None = None, max_entries: int = 65536) -> None:
        self.predictor = predictor
        self.refine_every = refine_every or int(getattr(predictor, "refine_every", 0) or 50)
        self._entries: dict[str, _Entry] = {}
        self._max = max_entries
        self.predictions = 0
        self._learns = learns_online(predictor)

    def bound(
        self,
        rid: str,
        prompt_text: Callable[[], str],
        prompt_len: int,
        app_id: str | None,
        generated: int,
        generated_text: Callable[[int], str] | None = None,
    ) -> float | None:
        """`prompt_text` is called once per request (decoding a prompt is not free);
        `generated_text(n)` gives the first n generated tokens as text at each refinement.
        None: no guess yet (an online predictor's cold start), so the client's cap bounds it."""
        checkpoint = (max(generated, 0) // self.refine_every) * self.refine_every
        entry = self._entries.get(rid)
        if entry is None or entry.checkpoint != checkpoint or not math.isfinite(entry.bound):  # no guess: ask again
            text = entry.prompt_text if entry is not None else prompt_text()
            so_far = generated_text(checkpoint) if generated_text is not None and checkpoint > 0 else ""
            value = self.predictor.predict(text, prompt_len, app_id, generated=checkpoint, generated_text=so_far)
            self.predictions += 1
            if entry is None:
                if len(self._entries) >= self._max:
                    self._entries.pop(next(iter(self._entries)))
                entry = self._entries[rid] = _Entry(checkpoint, value, value, text, prompt_len)
            else:
                entry.checkpoint, entry.bound = checkpoint, value
                if not math.isfinite(entry.initial):  # its first real guess is the one to score
                    entry.initial = value
        return floor_at_generated(entry.bound, generated) if math.isfinite(entry.bound) else None

    def forget(self, rid: str) -> _Entry | None:
        """Drop a finished request; returns its entry so callers can score the prediction."""
        return self._entries.pop(rid, None)

    def finished(self, rid: str, app_id: str | None, output_tokens: int) -> _Entry | None:
        """A request answered in full: forget it and, when the predictor learns online (the
        history default), teach it this answer's length (and its prompt's, when a bound was
        asked for it). Returns the request's entry."""
        entry = self.forget(rid)
        if self._learns:
            prompt_len = entry.prompt_len if entry is not None else None
            self.predictor.observe(app_id, output_tokens, prompt_len)  # type: ignore[attr-defined]
        return entry

    def __len__(self) -> int:
        return len(self._entries)


class BoundAccuracy:
    """Recent accuracy of arrival-time bounds against what requests really produced."""

    def __init__(self, window: int = 256) -> None:
        self._pairs: deque[tuple[float, int]] = deque(maxlen=window)

    def record(self, predicted: float, actual: int) -> None:
        self._pairs.append((predicted, actual))

    def summary(self) -> dict[str, float | int] | None:
        if not self._pairs:
            return None
        n = len(self._pairs)
        return {
            "requests": n,
            "mae_tokens": round(sum(abs(p - a) for p, a in self._pairs) / n, 2),
            "under_estimate_rate": round(sum(p < a for p, a in self._pairs) / n, 4),
        }
