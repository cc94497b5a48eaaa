"""Pacing each forward pass to an emulated GPU's iteration time, and measuring how well it works.

The emulating server runs the tiny model on CPU. Each step then waits until the profile's
predicted time for that exact batch has passed since the step began, so policies meet GPU
time scales and GPU batching curves. When the CPU step alone takes longer than the target,
the step is late: that distortion is counted and reported, never hidden.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
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
            "median_abs_error": r(self.median_abs_error),
            "p95_abs_error": r(self.p95_abs_error),
        }


class Pacer:
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
        self._errors: deque[float] = deque(maxlen=window)

    def target_s(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.model.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)

    def finish(self, started: float, target_s: float) -> float:
        """Wait out the rest of the step's target; return the step's observed duration."""
        if target_s <= 0:
            self.unpaced += 1
            return self.clock() - started
        deadline = started + target_s
        worked = self.clock() - started
        late = worked > target_s
        if not late:
            rest = deadline - self.clock()
            if rest > SPIN_S:
                self.sleep(rest - SPIN_S)
            while self.clock() < deadline:
                pass
        observed = self.clock() - started
        self.steps += 1
        if late:
            self.late += 1
            self._overrun_s += observed - target_s
        self._errors.append(abs(observed - target_s) / target_s)
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
            median_abs_error=quantile(0.5),
            p95_abs_error=quantile(0.95),
        )
