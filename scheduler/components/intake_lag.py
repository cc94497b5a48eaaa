"""How long a request took from the HTTP edge's arrival stamp to the scheduler's intake.

Why: every SLO clock starts at the edge, but a policy can act on a request only once the
scheduler has received it (tokenised, sent over ZMQ, read at the top of a loop iteration). The
loop's wait for its next read is the engine's and a simulator models it; host transit on top
of it eats the TTFT slack that just-in-time plans leave and no simulator sees. The status
reports both so a benchmark can tell the host from the policy when a live run falls short of
its simulated twin.
"""

from __future__ import annotations

from collections import deque

import numpy as np

WINDOW = 4096  # recent requests the quantiles cover: the lag under the current load, not the run's


class IntakeLag:
    """Recent edge-to-scheduler lags (seconds), with the run's count and maximum.

    Part of every lag is the engine's own: the scheduler reads its socket once per loop
    iteration, so a request waits up to one pass even on an idle host (a simulator models
    that). The rest is host transit: a request whose edge stamp precedes the iteration before
    the one that read it could have been read there, had it reached the socket; it missed that
    iteration by (that iteration's start - its stamp) at least (`missed`)."""

    def __init__(self, window: int = WINDOW) -> None:
        self._recent: deque[float] = deque(maxlen=window)
        self._missed: deque[float] = deque(maxlen=window)
        self.requests = 0
        self.max_s = 0.0
        self._this_loop: float | None = None
        self._last_loop: float | None = None

    def loop(self, now: float) -> None:
        """The scheduler reads its socket now (once per loop iteration)."""
        self._last_loop, self._this_loop = self._this_loop, now

    def record(self, arrival: float | None, now: float) -> None:
        """`arrival`: the edge's stamp (unix time; None when the request carried none)."""
        if arrival is None:
            return
        lag = max(0.0, now - arrival)  # clocks of one host: a negative lag is rounding
        self._recent.append(lag)
        self._missed.append(max(0.0, self._last_loop - arrival) if self._last_loop is not None else 0.0)
        self.requests += 1
        self.max_s = max(self.max_s, lag)

    def summary(self) -> dict[str, float | int] | None:
        """Milliseconds: p50/p90/p99 of the recent window and the maximum since start; the
        share of the window that missed an iteration, and by how much (`missed_*`)."""
        if not self._recent:
            return None
        p50, p90, p99 = np.percentile(np.fromiter(self._recent, dtype=float), (50, 90, 99))
        missed = np.fromiter(self._missed, dtype=float)
        m50, m90, m99 = np.percentile(missed, (50, 90, 99))
        return {
            "requests": self.requests,
            "p50_ms": round(1000.0 * float(p50), 3),
            "p90_ms": round(1000.0 * float(p90), 3),
            "p99_ms": round(1000.0 * float(p99), 3),
            "max_ms": round(1000.0 * self.max_s, 3),
            "missed_loop_share": round(float(np.count_nonzero(missed)) / missed.size, 4),
            "missed_p50_ms": round(1000.0 * float(m50), 3),
            "missed_p90_ms": round(1000.0 * float(m90), 3),
            "missed_p99_ms": round(1000.0 * float(m99), 3),
        }
