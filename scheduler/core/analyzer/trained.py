"""The server's default length bound: the bundled trained table, with the recent-answers history
standing by for traffic unlike the trace the table was trained on.

A table trained on one public trace is right from the first request for traffic like it, and
wrong for a service whose answers look nothing like it (a code-completion service's answers are
a tenth as long as a chat service's), or once its own traffic drifts. The recent-answers
quantile learns any traffic but only after answers are in; per prompt-length band it also sees
the prompt's length, but needs answers in each band. So all three run: every answered request
scores each one's arrival bound by the pinball loss at the bound's quantile (what a quantile
bound minimises), and a request is bounded by the one with the lowest recent loss; the table
alone until the histories have answers scored. None ever reads the length of the request it
bounds: only finished answers teach.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from scheduler.core.analyzer.base import LengthPredictor, LengthSample
from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor
from scheduler.core.analyzer.table import LengthTable

BUNDLED_TABLE = Path(__file__).with_name("tables") / "azure_conv.json"
COLD_START = 20  # answers the history needs before it bounds anything (the history default's)


def pinball(bound: float, actual: float, q: float) -> float:
    """The q-quantile's loss: under-estimates cost q per token, over-estimates 1 - q."""
    return q * (actual - bound) if actual > bound else (1.0 - q) * (bound - actual)


class TrainedPredictor(LengthPredictor):
    """Per request, the bound (table, history, history by prompt band) with the lowest recent loss."""

    name = "trained"
    EXPERTS = ("table", "history", "history-len")

    def __init__(
        self,
        table: LengthTable,
        quantile: float = 0.9,
        memory: int = 200,
        min_scored: int = COLD_START,
        switch: bool = True,
    ) -> None:
        self.table = table
        self.histories = {
            name: HistoryPredictor(
                HistoryParams(
                    quantile=quantile,
                    default=math.inf,
                    min_global=COLD_START,
                    min_count=COLD_START,
                    by_prompt_len=name == "history-len",
                )
            )
            for name in self.EXPERTS[1:]
        }
        self._quantile = quantile
        self.decay = 1.0 / memory  # exponential memory of the losses, in answers
        self.min_scored = min_scored
        self.switch = switch  # False: the table alone (the evaluation's static row)
        self.losses = dict.fromkeys(self.EXPERTS, 0.0)
        self.scored = 0

    @property
    def quantile(self) -> float:
        return self._quantile

    @quantile.setter
    def quantile(self, q: float) -> None:
        """`--slo-quantile` sets every bound's quantile."""
        self._quantile = q
        for h in self.histories.values():
            h.quantile = q

    def chosen(self) -> str:
        """The bound in use: the table until the histories have scored `min_scored` answers."""
        if not self.switch or self.scored < self.min_scored:
            return "table"
        return min(self.EXPERTS, key=lambda name: self.losses[name])  # ties: the table (listed first)

    def _arrival_bound(self, name: str, prompt_len: int, app_id: str | None) -> float:
        if name == "table":
            return self.table.quantile(prompt_len, self._quantile)
        return self.histories[name].predict("", prompt_len, app_id)

    def observe(self, app_id: str | None, output_len: int, prompt_len: int | None = None) -> None:
        """A finished answer: score every arrival bound on it, then teach the histories."""
        if prompt_len is not None:
            bounds = {name: self._arrival_bound(name, prompt_len, app_id) for name in self.EXPERTS}
            if all(math.isfinite(b) for b in bounds.values()):  # the histories are past their cold start
                keep = 1.0 - self.decay
                for name, bound in bounds.items():
                    loss = pinball(bound, output_len, self._quantile)
                    self.losses[name] = keep * self.losses[name] + self.decay * loss
                self.scored += 1
        for h in self.histories.values():
            h.observe(app_id, output_len, prompt_len)

    def fit(self, samples: Sequence[LengthSample]) -> TrainedPredictor:
        """Online warm-up from finished requests (the table itself is trained offline)."""
        for s in samples:
            self.observe(s.app_id, s.output_len, s.prompt_len)
        return self

    def _estimate(self, prompt_text: str, prompt_len: int, app_id: str | None, generated: int, text: str) -> float:
        name = self.chosen()
        if name != "table":
            return self.histories[name].predict(prompt_text, prompt_len, app_id, generated)
        return self.table.quantile(prompt_len, self._quantile, generated)


def trained_predictor(quantile: float = 0.9, path: str | Path | None = None, **kw: object) -> TrainedPredictor:
    """The bundled table (or the one at `path`, written by benchmarks/predictor/train_length.py)."""
    return TrainedPredictor(LengthTable.load(path or BUNDLED_TABLE), quantile, **kw)  # type: ignore[arg-type]
