"""How long a request took from the HTTP edge's arrival stamp to the scheduler's intake.

Why: every SLO clock starts at the edge, but a policy can act on a request only once the
scheduler has received it (tokenised, sent over ZMQ, read at the top of a loop iteration). On a
busy host that lag grows with the load, eats the TTFT slack that just-in-time plans leave, and
is invisible to a simulator. The status reports it so a benchmark can tell the host from the
policy when a live run falls short of its simulated twin.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 4096  # recent requests the quantiles cover: the lag under the current load, not the run's


class IntakeLag:
    """Recent edge-to-scheduler lags (seconds), with the run's count and maximum."""

    def __init__(self, window: int = WINDOW) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self.requests = 0
        self.max_s = 0.0

    def record(self, arrival: float | None, now: float) -> None:
        """`arrival`: the edge's stamp (unix time; None when the request carried none)."""
        if arrival is None:
            return
        lag = max(0.0, now - arrival)  # clocks of one host: a negative lag is rounding
        self._recent.append(lag)
        self.requests += 1
        self.max_s = max(self.max_s, lag)

    def summary(self) -> dict[str, float | int] | None:
        """Milliseconds: p50/p90/p99 of the recent window, the maximum since start."""
        if not self._recent:
            return None
        p50, p90, p99 = np.percentile(np.fromiter(self._recent, dtype=float), (50, 90, 99))
        return {
            "requests": self.requests,
            "p50_ms": round(1000.0 * float(p50), 3),
            "p90_ms": round(1000.0 * float(p90), 3),
            "p99_ms": round(1000.0 * float(p99), 3),
            "max_ms": round(1000.0 * self.max_s, 3),
        }
