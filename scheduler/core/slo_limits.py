"""What one API key may ask of the scheduler: the classes it may use, the tightest targets and
the largest weight. An SLO is a priority, so on a shared server it is also a tenant's claim on
everyone else's capacity; these limits keep that claim within what the operator granted.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.slo import SloClass

CLAMP = "clamp"  # an SLO beyond the limits is moved to the limit and the response says so
REJECT = "reject"  # an SLO beyond the limits is refused with HTTP 403 naming the field
ON_VIOLATION = (CLAMP, REJECT)


@dataclass(frozen=True)
class SloLimits:
    """Per-key bounds on a client's SLO (None: no bound)."""

    classes: frozenset[SloClass] | None = None  # the classes the key may use (None: any)
    min_ttft_ms: float | None = None  # the tightest first-token target it may ask for
    min_tpot_ms: float | None = None  # the tightest per-token target
    min_deadline_ms: float | None = None  # the tightest end-to-end deadline
    max_weight: float | None = None  # the largest service-gain weight
    on_violation: str = CLAMP
