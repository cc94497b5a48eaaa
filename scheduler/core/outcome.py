"""What happened to one request against its SLO, from the times its tokens left the engine.

Used for every response's report, for the server's counters and by benchmarks, so "attained"
means the same thing everywhere. TPOT is deadline-based (PolyServe §2.3): token i is due at
arrival + ttft + i·tpot, so an early token banks slack for later ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.core.estimates import absolute_deadline
from scheduler.core.slo import SloSpec


@dataclass(frozen=True)
class SloOutcome:
    slo: SloSpec
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    worst_lateness_s: float | None  # max over tokens of (emitted - due); <= 0 means all on time
    on_time_tokens: int  # tokens emitted by their DSLO due time (all tokens if no DSLO)
    ttft_ok: bool | None
    tpot_ok: bool | None
    deadline_ok: bool | None
    finished: bool  # False when the request was dropped (queue timeout, abort)

    @property
    def attained(self) -> bool:
        if not self.finished:
            return False
        return all(ok is not False for ok in (self.ttft_ok, self.tpot_ok, self.deadline_ok))

    def to_dict(self) -> dict[str, Any]:
        def ms(x: float | None) -> float | None:
            return None if x is None else round(x * 1000.0, 3)

        return {
            "spec": self.slo.to_dict(),
            "ttft_ms": ms(self.ttft_s),
            "e2e_ms": ms(self.e2e_s),
            "output_tokens": self.output_tokens,
            "worst_token_lateness_ms": ms(self.worst_lateness_s),
            "on_time_tokens": self.on_time_tokens,
            "attained": {
                "ttft": self.ttft_ok,
                "tpot": self.tpot_ok,
                "deadline": self.deadline_ok,
                "overall": self.attained,
            },
        }


def _due_s(slo: SloSpec, index: int) -> float:
    """Seconds after arrival that token `index` is due, for an SLO known to have a TTFT."""
    due = slo.token_due_s(index)
    assert due is not None
    return due


def evaluate(
    slo: SloSpec,
    arrival: float,
    token_times: Sequence[float],
    finish_time: float,
    finished: bool = True,
    deadline_abs: float | None = None,
) -> SloOutcome:
    """Score one request. `deadline_abs` overrides arrival + deadline_ms (compound programs
    measure their deadline from the program's first arrival)."""
    ttft = token_times[0] - arrival if token_times else None
    worst: float | None = None
    on_time = len(token_times)
    if slo.ttft_ms is not None and token_times:
        on_time = 0
        for i, t in enumerate(token_times):
            lateness = t - (arrival + _due_s(slo, i))
            worst = lateness if worst is None else max(worst, lateness)
            on_time += lateness <= 0
    ttft_ok = None if slo.ttft_ms is None else (ttft is not None and ttft <= slo.ttft_ms / 1000.0)
    tpot_ok = None
    if slo.tpot_ms is not None and slo.ttft_ms is not None:
        tpot_ok = bool(token_times) and all(t <= arrival + _due_s(slo, i) for i, t in enumerate(token_times) if i > 0)
    deadline_ok = None
    if slo.deadline_ms is not None:
        due = deadline_abs if deadline_abs is not None else absolute_deadline(slo.deadline_ms / 1000.0, arrival)
        deadline_ok = finished and finish_time <= due
    return SloOutcome(
        slo=slo,
        ttft_s=ttft,
        e2e_s=finish_time - arrival,
        output_tokens=len(token_times),
        worst_lateness_s=worst,
        on_time_tokens=on_time,
        ttft_ok=ttft_ok,
        tpot_ok=tpot_ok,
        deadline_ok=deadline_ok,
        finished=finished,
    )
