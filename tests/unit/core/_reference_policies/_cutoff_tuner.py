"""Online tuning of GMAX's cutoff p (JITServe §4.2: "explores different thresholds and converges
to those that maximize end-to-end goodput").

Deterministic hill climbing over a sorted grid: each epoch runs one cutoff and records the
goodput per second it earned (an exponential average per grid point); the next epoch either
exploits the best point so far or, every other epoch, probes a neighbour of it."""

from __future__ import annotations

from collections.abc import Sequence


class CutoffTuner:
    def __init__(
        self, grid: Sequence[float], start: float, epoch_steps: int = 500, enabled: bool = True, ema: float = 0.5
    ) -> None:
        self.grid = sorted(grid)
        self.index = self.grid.index(start)
        self.best = self.index
        self.epoch_steps = max(1, epoch_steps)
        self.enabled = enabled
        self.ema = ema
        self.scores: dict[int, float] = {}
        self._acc = 0.0
        self._epoch_start: tuple[int, float] | None = None
        self._epochs = 0

    @property
    def current(self) -> float:
        return self.grid[self.index]

    def reward(self, amount: float) -> None:
        self._acc += amount

    def step(self, step: int, now: float) -> None:
        if not self.enabled:
            return
        if self._epoch_start is None:
            self._epoch_start = (step, now)
            return
        start_step, start_time = self._epoch_start
        if step - start_step < self.epoch_steps or now <= start_time:
            return
        rate = self._acc / (now - start_time)
        old = self.scores.get(self.index)
        self.scores[self.index] = rate if old is None else self.ema * rate + (1 - self.ema) * old
        self.best = max(self.scores, key=lambda i: (self.scores[i], -abs(i - self.best)))
        self._epochs += 1
        self.index = self._next()
        self._acc = 0.0
        self._epoch_start = (step, now)

    def _next(self) -> int:
        if self._epochs % 2 == 0:
            return self.best
        unexplored = [i for i in (self.best - 1, self.best + 1) if 0 <= i < len(self.grid) and i not in self.scores]
        if unexplored:
            return unexplored[0]
        lo, hi = self.best - 1, self.best + 1
        cands = [i for i in (lo, hi) if 0 <= i < len(self.grid)]
        return cands[(self._epochs // 2) % len(cands)] if cands else self.best
