"""Timing forward passes on a GPU with CUDA events, for the online perf model.

On a GPU `run_batch` returns once the forward is launched: with overlap scheduling (SGLang's
default) and without it, the host waits for the GPU only when it processes the pass's result,
at SGLang's copy-done synchronisation. The wall time around `run_batch` is the launch, not the
pass. So a pass is bracketed by two events recorded on the stream the forward runs on, and read
when its result has been processed: by then the GPU has passed the end event, and reading it
costs nothing. With overlap the next pass is already queued behind the end event; it does not
delay the reading, since events complete in stream order.

What is measured: GPU time from the moment the stream could start the pass (its inputs ready,
the previous pass done) to the end of its forward, including sampling and, when the stream
carries it, the copy of the results to the host. Host-side scheduling is not in it: with
overlap it is hidden behind the GPU; without overlap it adds to each iteration's wall time.

The events come from an injected factory (torch.cuda.Event in the adapter), so the tests run
this on a fake event clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

Shape = tuple[int, int, int]  # (prefill tokens, decoding requests, KV tokens), as batch_shape


class Event(Protocol):
    """What the timer uses of torch.cuda.Event (created with enable_timing=True)."""

    def record(self, stream: Any = None) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end_event: Any) -> float: ...  # milliseconds


@dataclass
class Bracket:
    """One launched pass: its events and what it computed."""

    start: Event
    end: Event | None = None
    shape: Shape | None = None
    spec_steps: int = 0


@dataclass(frozen=True)
class TimedStep:
    shape: Shape
    spec_steps: int
    seconds: float


class GpuStepTimer:
    """`start` before the launch, `stop` after it (keyed by the pass's result object), `read`
    once SGLang has processed that result. Passes whose result never comes back (a dropped
    batch) are forgotten after `max_pending` newer ones."""

    def __init__(
        self,
        new_event: Callable[[], Event],
        stream: Callable[[], Any],
        before_start: Callable[[], None] | None = None,
        max_pending: int = 32,
    ) -> None:
        self._new_event = new_event
        self._stream = stream  # the stream the forward runs on (looked up per pass)
        self._before_start = before_start  # e.g. make that stream wait for the inputs' stream
        self._pending: OrderedDict[int, Bracket] = OrderedDict()
        self.max_pending = max_pending
        self.timed = 0
        self.lost = 0

    def start(self) -> Bracket:
        if self._before_start is not None:
            self._before_start()
        event = self._new_event()
        event.record(self._stream())
        return Bracket(start=event)

    def stop(self, bracket: Bracket, key: object, shape: Shape, spec_steps: int) -> None:
        """After the launch: the end event follows the pass on its stream."""
        bracket.end = self._new_event()
        bracket.end.record(self._stream())
        bracket.shape, bracket.spec_steps = shape, spec_steps
        self._pending[id(key)] = bracket
        while len(self._pending) > self.max_pending:
            self._pending.popitem(last=False)
            self.lost += 1

    @staticmethod
    def wait(bracket: Bracket) -> None:
        """Block until the GPU has finished the pass (pacing an emulated card needs its end)."""
        if bracket.end is not None:
            bracket.end.synchronize()

    def read(self, key: object) -> TimedStep | None:
        """The pass whose result is `key`, once that result has been processed (None: not timed)."""
        bracket = self._pending.pop(id(key), None)
        if bracket is None or bracket.end is None or bracket.shape is None:
            return None
        bracket.end.synchronize()  # already reached: the result's copy-done came after it
        self.timed += 1
        return TimedStep(bracket.shape, bracket.spec_steps, bracket.start.elapsed_time(bracket.end) / 1000.0)

    def status(self) -> dict[str, int]:
        return {"timed_passes": self.timed, "untimed_passes": self.lost, "pending": len(self._pending)}
