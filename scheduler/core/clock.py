"""Injected clocks: policies never call time.time() themselves, so virtual time works."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds; only differences and comparisons with request timestamps matter."""
        ...


class WallClock:
    """Unix time, the same domain as the arrival stamp the HTTP layer puts on a request."""

    def now(self) -> float:
        return time.time()


class ManualClock:
    """A clock tests and simulators advance explicitly."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock never goes backwards")
        self._t += seconds

    def set(self, t: float) -> None:
        if t < self._t:
            raise ValueError("a clock never goes backwards")
        self._t = t
