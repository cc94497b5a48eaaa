"""SLOs-Serve's planner (Chen et al.): multi-SLO DP soft admission, dynamic batch size and
SLO-adaptive speculation length, as plain functions the `slos` policy composes."""

from scheduler.core.slos_serve.batch_formation import BatchShape, prefill_capacity
from scheduler.core.slos_serve.dp import DpItem, DpResult, TierBudget, interval_budget
from scheduler.core.slos_serve.soft_admission import admit
from scheduler.core.slos_serve.spec_length import LengthChoice, Tier, acceptance, optimize_spec_lengths

__all__ = [
    "BatchShape",
    "DpItem",
    "DpResult",
    "LengthChoice",
    "Tier",
    "TierBudget",
    "acceptance",
    "admit",
    "interval_budget",
    "optimize_spec_lengths",
    "prefill_capacity",
]
