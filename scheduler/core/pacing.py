"""Pacing each forward pass to an emulated GPU's iteration time, and measuring how well it works.

The emulating server runs SGLang on CPU with the tiny model. Each step occupies the emulated
card for the profile's predicted time for that exact batch, and its results are used only once
the card is done, so policies meet GPU time scales and GPU batching curves. When a step's CPU
work alone takes longer than the target, the step is late; when the host's work between steps
cannot hide behind the card's, the card idles. Both distortions are counted and reported,
never hidden.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from scheduler.core.perf_model import PerfModel, StepTimeModel

SPIN_S = 3e-4  # finish the wait spinning: time.sleep overshoots by ~0.1 ms, a lot at 7 ms steps


class SlowedPerfModel(StepTimeModel):
    """Another model's times, `factor` times longer: the emulated GPU in dilated time.

    A 2-core host cannot run SGLang's scheduler plus a forward pass in an H100's 7 ms, so the
    emulation can run every step `factor` times slower than the card. Ratios between cards,
    batch shapes and policies are kept; clients scale their SLOs by the same factor."""

    def __init__(self, base: PerfModel, factor: float) -> None:
        if not factor >= 1.0:
            raise ValueError("the slowdown factor must be >= 1")
        self.base = base
        self.factor = factor

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.factor * self.base.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)


@dataclass(frozen=True)
class PacingReport:
    steps: int
    unpaced_steps: int  # steps the model gave no time (an unknown batch shape): never hidden
    late_steps: int
    late_share: float  # steps whose CPU work alone overran the target
    mean_overrun_ms: float  # mean (observed − target) over late steps
    mean_overrun_share: float  # mean (observed − target) / target over late steps
    host_gap_share: float  # card idle between back-to-back steps, over their time: host work not hidden
    host_gap_s: float  # ... in seconds, in total (totals let a caller take the share of a window)
    back_to_back_s: float  # card time of the steps that followed another
    median_abs_error: float | None  # |observed − target| / target over recent steps
    p95_abs_error: float | None

    def to_dict(self) -> dict[str, float | int | None]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 4)

        return {
            "steps": self.steps,
            "unpaced_steps": self.unpaced_steps,
            "late_steps": self.late_steps,
            "late_share": r(self.late_share),
            "mean_overrun_ms": r(self.mean_overrun_ms),
            "mean_overrun_share": r(self.mean_overrun_share),
            "host_gap_share": r(self.host_gap_share),
            "host_gap_s": r(self.host_gap_s),
            "back_to_back_s": r(self.back_to_back_s),
            "median_abs_error": r(self.median_abs_error),
            "p95_abs_error": r(self.p95_abs_error),
        }


class Pacer:
    """The emulated card's timeline: one step at a time, each lasting its profile time.

    A step occupies the card from when it was launched, or when the card finished the step
    before, whichever is later, for its target. Its results may be used only once that time has
    come (`wait`), so with SGLang's overlap loop the host's work between steps (scheduling,
    processing and streaming the previous step's results) runs while the card is busy, as it
    does next to a real GPU: an iteration lasts the card's time, not the card's plus the host's.
    A step is late when its own CPU work (the forward pass) ends after its target; the host's
    time between steps is outside every step and reported apart (`host_gap_share`)."""

    def __init__(
        self,
        model: PerfModel,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
        window: int = 4096,
    ) -> None:
        self.model = model
        self.clock = clock
        self.sleep = sleep
        self.steps = 0
        self.unpaced = 0
        self.late = 0
        self._overrun_s = 0.0
        self._overrun_share = 0.0
        self._errors: deque[float] = deque(maxlen=window)
        self._card_free_at = -math.inf  # when the card finishes the last launched step
        self._pending: dict[Hashable, float] = {}  # launched steps whose results were not waited for
        self._gap_s = 0.0  # card idle between back-to-back steps: host work not hidden
        self._back_to_back_s = 0.0  # step time of those steps

    def target_s(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.model.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)

    def launch(self, key: Hashable, started: float, target_s: float, follows_step: bool = False) -> float:
        """Put a step whose CPU work began at `started` and has just ended on the card; return
        its duration on the card. `follows_step`: the engine ran a step in the loop iteration
        before (a gap before this one is host work, not idle time)."""
        if target_s <= 0:
            self.unpaced += 1
            return self.clock() - started
        while len(self._pending) >= 2:  # the card runs one step ahead of its results at most
            self.wait(next(iter(self._pending)))
        card_start = max(started, self._card_free_at)
        if follows_step and self._card_free_at > -math.inf:
            self._gap_s += card_start - self._card_free_at
            self._back_to_back_s += target_s
        deadline = card_start + target_s
        overrun = self.clock() - deadline
        self.steps += 1
        if overrun > 0:  # the step's own CPU work did not fit its target: it ends when that does
            self.late += 1
            self._overrun_s += overrun
            self._overrun_share += overrun / target_s
            deadline += overrun
        self._errors.append(max(overrun, 0.0) / target_s)
        self._card_free_at = self._pending[key] = deadline
        return deadline - card_start

    def busy_s(self) -> float:
        """Seconds until the card finishes every step launched so far: with the overlap loop the
        next pass is planned while the last one still runs, and starts only then."""
        return max(0.0, self._card_free_at - self.clock())

    def wait(self, key: Hashable) -> None:
        """Block until the card has finished the step launched under `key` (no-op otherwise)."""
        deadline = self._pending.pop(key, None)
        if deadline is None:
            return
        rest = deadline - self.clock()
        if rest > SPIN_S:
            self.sleep(rest - SPIN_S)
        while self.clock() < deadline:
            pass

    def finish(self, started: float, target_s: float, follows_step: bool = False) -> float:
        """Launch a step and wait for it: a loop that uses each step's results at once."""
        key = object()
        observed = self.launch(key, started, target_s, follows_step)
        self.wait(key)
        return observed

    def report(self) -> PacingReport:
        errors = sorted(self._errors)

        def quantile(q: float) -> float | None:
            return errors[min(len(errors) - 1, int(q * len(errors)))] if errors else None

        return PacingReport(
            steps=self.steps,
            unpaced_steps=self.unpaced,
            late_steps=self.late,
            late_share=self.late / self.steps if self.steps else 0.0,
            mean_overrun_ms=1000.0 * self._overrun_s / self.late if self.late else 0.0,
            mean_overrun_share=self._overrun_share / self.late if self.late else 0.0,
            host_gap_share=self._gap_s / (self._gap_s + self._back_to_back_s) if self._back_to_back_s else 0.0,
            host_gap_s=self._gap_s,
            back_to_back_s=self._back_to_back_s,
            median_abs_error=quantile(0.5),
            p95_abs_error=quantile(0.95),
        )
