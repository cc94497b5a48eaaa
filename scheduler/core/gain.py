"""Realised service gain (Tempo §3.1, Eqs. 1–3): how much useful service a request delivered.

Finishing faster than the SLO earns nothing extra; missing it degrades the gain by
f(SLO, x) = min(1, (SLO/x)^α). α = 1 is Tempo's default; α → ∞ (``math.inf``) is the step
"all or nothing" used by plain SLO goodput. One formula covers every class so a mixed workload
is scored on one scale:

    gain = weight · [w_i·L_i·f(TTFT) + Σ_tokens w_o·f(token i)] · f(deadline)

where a factor is 1 when the SLO has no such target. A pure deadline/compound request reduces to
Eq. 2, (w_i·L_i + w_o·L_o)·f(SLO_TTLT, TTLT); a latency request to Eq. 3, with token i degraded
against its deadline-based due time ttft + i·tpot (PolyServe §2.3), both measured from arrival.
Eq. 1 (`base_gain`), the token weights and f (`degradation`) live in scheduler.core.estimates,
which the policies' predictions share.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scheduler.core.estimates import DEFAULT_WEIGHTS, GainWeights, check_alpha, degradation
from scheduler.core.outcome import SloOutcome


def _late_factor(slo_s: float, lateness_s: float, alpha: float) -> float:
    """f for a target `slo_s` missed by `lateness_s`; on-time is decided on the lateness alone so
    it agrees with outcome.evaluate's `lateness <= 0` test even at float boundaries."""
    if lateness_s <= 0:
        return 1.0
    if math.isinf(alpha):
        return 0.0  # even when slo_s + lateness_s rounds back to slo_s
    return degradation(slo_s, slo_s + lateness_s, alpha)


def outcome_gain(
    outcome: SloOutcome,
    input_tokens: int,
    *,
    alpha: float = 1.0,
    weights: GainWeights = DEFAULT_WEIGHTS,
    token_times: Sequence[float] | None = None,
    arrival: float | None = None,
    ttlt_s: float | None = None,
) -> float:
    """Realised service gain of one scored request (0 for a dropped one).

    `token_times` + `arrival` (the same values given to evaluate) make Eq. 3 exact per token.
    Without them only the outcome's summary is known: on-time tokens get full value and each
    late token is valued at f(ttft_slo, ttft_slo + worst lateness), a lower bound (exact for
    α = 0 and α → ∞). `ttlt_s` overrides outcome.e2e_s as the time to last token, e.g. measured
    from a compound program's first arrival. A deadline the outcome marks missed never earns the
    full gain: if its lateness cannot be seen in the times, the step (0) is used.
    """
    check_alpha(alpha)
    if not outcome.finished:
        return 0.0
    slo = outcome.slo
    in_factor = _ttft_factor(outcome, alpha)
    out_value = _output_value(outcome, alpha, token_times, arrival)
    gain = weights.w_in * input_tokens * in_factor + weights.w_out * out_value
    return slo.weight * gain * _deadline_factor(outcome, alpha, ttlt_s)


def _ttft_factor(outcome: SloOutcome, alpha: float) -> float:
    slo = outcome.slo
    if slo.ttft_ms is None or outcome.ttft_ok:
        return 1.0
    target = slo.ttft_ms / 1000.0
    seen = outcome.ttft_s if outcome.ttft_s is not None else outcome.e2e_s
    return _missed_factor(target, seen, alpha)


def _output_value(
    outcome: SloOutcome, alpha: float, token_times: Sequence[float] | None, arrival: float | None
) -> float:
    """Σ over output tokens of f(token due, token emitted), in tokens."""
    slo = outcome.slo
    n = outcome.output_tokens
    if slo.ttft_ms is None or slo.tpot_ms is None or n == 0:
        return float(n)
    if token_times is not None:
        if arrival is None:
            raise ValueError("token_times needs the arrival they are measured from")
        if len(token_times) != n:
            raise ValueError(f"token_times has {len(token_times)} entries, the outcome {n} tokens")
        total = 0.0
        for i, t in enumerate(token_times):
            due = slo.token_due_s(i)
            assert due is not None  # the SLO has a TTFT (checked above)
            lateness = t - (arrival + due)
            total += _late_factor(due, lateness, alpha)
        return total
    late = n - outcome.on_time_tokens
    if late <= 0:
        return float(n)
    worst = outcome.worst_lateness_s if outcome.worst_lateness_s is not None else math.inf
    floor = 0.0 if math.isinf(worst) else _late_factor(slo.ttft_ms / 1000.0, worst, alpha)
    return outcome.on_time_tokens + late * floor


def _deadline_factor(outcome: SloOutcome, alpha: float, ttlt_s: float | None) -> float:
    slo = outcome.slo
    if slo.deadline_ms is None or outcome.deadline_ok:
        return 1.0
    seen = ttlt_s if ttlt_s is not None else outcome.e2e_s
    return _missed_factor(slo.deadline_ms / 1000.0, seen, alpha)


def _missed_factor(target_s: float, seen_s: float, alpha: float) -> float:
    """f for a target the outcome marks missed; 0 when the times do not show by how much."""
    return 0.0 if seen_s <= target_s else degradation(target_s, seen_s, alpha)
