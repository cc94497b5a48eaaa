"""Goodput definitions over scored requests, so policies and benchmarks count the same way.

Each function takes the `SloOutcome`s of one run. Definitions that weigh input tokens also take
`prompt_tokens`, the prompt length of each outcome in the same order (an outcome does not carry
it). Best-effort requests have no target; `include_best_effort` says whether their finished
work counts (on by default for request goodput, where "attained" already says finished).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.core.estimates import DEFAULT_WEIGHTS, GainWeights, base_gain
from scheduler.core.gain import outcome_gain
from scheduler.core.outcome import SloOutcome
from scheduler.core.slo import SloClass


def _check_lengths(outcomes: Sequence[SloOutcome], prompt_tokens: Sequence[int]) -> None:
    if len(outcomes) != len(prompt_tokens):
        raise ValueError(f"{len(outcomes)} outcomes but {len(prompt_tokens)} prompt lengths")


def request_goodput(outcomes: Sequence[SloOutcome], include_best_effort: bool = True) -> int:
    """Requests that met every target they had (the DistServe/SLOs-Serve count)."""
    return sum(o.attained for o in outcomes if include_best_effort or not o.slo.is_best_effort)


def attainment(outcomes: Sequence[SloOutcome], include_best_effort: bool = False) -> float:
    """Share of requests attained (1.0 for an empty run: nothing was missed)."""
    pool = [o for o in outcomes if include_best_effort or not o.slo.is_best_effort]
    return 1.0 if not pool else sum(o.attained for o in pool) / len(pool)


def dslo_token_goodput(outcomes: Sequence[SloOutcome], include_best_effort: bool = False) -> int:
    """Output tokens emitted by their due time. With a TTFT target token i is due at
    ttft + i·tpot (PolyServe §2.3), and tokens delivered on time count even if the request was
    later dropped; without one, every token is due at the end-to-end deadline, so a request's
    tokens count only if it finished by it (a miss gives 0: which tokens were early is unknown)."""
    total = 0
    for o in outcomes:
        slo = o.slo
        if slo.is_best_effort:
            total += o.output_tokens if include_best_effort and o.finished else 0
        elif slo.ttft_ms is not None:
            total += o.on_time_tokens
        elif slo.deadline_ms is not None:
            total += o.output_tokens if o.deadline_ok else 0
    return total


def jitserve_token_goodput(
    outcomes: Sequence[SloOutcome], prompt_tokens: Sequence[int], include_best_effort: bool = False
) -> int:
    """JITServe §3: latency requests count tokens delivered by TTFT_SLO + i·TBT_SLO; deadline
    requests count input + output tokens if they finish by the deadline, else 0; compound
    requests count all tokens of all their program's calls if the program met its deadline,
    else 0. A program met it when every call we saw finished by the program deadline (calls
    feed the final one, so this is "the final generation completed by the E2EL deadline")."""
    _check_lengths(outcomes, prompt_tokens)
    total = 0
    programs: dict[str, list[tuple[SloOutcome, int]]] = defaultdict(list)
    for o, p in zip(outcomes, prompt_tokens, strict=True):
        cls = o.slo.slo_class
        if cls is SloClass.COMPOUND and o.slo.program_id is not None:
            programs[o.slo.program_id].append((o, p))
        elif cls is SloClass.LATENCY:
            total += o.on_time_tokens
        elif cls in (SloClass.DEADLINE, SloClass.COMPOUND):
            total += p + o.output_tokens if o.finished and o.deadline_ok else 0
        elif include_best_effort and o.finished:
            total += p + o.output_tokens
    for calls in programs.values():
        if all(o.finished and o.deadline_ok for o, _ in calls):
            total += sum(p + o.output_tokens for o, p in calls)
    return total


def service_gain_total(
    outcomes: Sequence[SloOutcome],
    prompt_tokens: Sequence[int],
    alpha: float = 1.0,
    weights: GainWeights = DEFAULT_WEIGHTS,
    include_best_effort: bool = True,
) -> float:
    """Σ realised service gain (Tempo Eqs. 1–3) from outcome summaries (see outcome_gain)."""
    _check_lengths(outcomes, prompt_tokens)
    return sum(
        outcome_gain(o, p, alpha=alpha, weights=weights)
        for o, p in zip(outcomes, prompt_tokens, strict=True)
        if include_best_effort or not o.slo.is_best_effort
    )


def service_gain_potential(
    outcomes: Sequence[SloOutcome],
    prompt_tokens: Sequence[int],
    weights: GainWeights = DEFAULT_WEIGHTS,
    include_best_effort: bool = True,
) -> float:
    """The gain had every request finished within its SLO: the denominator of a gain ratio."""
    _check_lengths(outcomes, prompt_tokens)
    return sum(
        base_gain(p, o.output_tokens, o.slo.weight, weights)
        for o, p in zip(outcomes, prompt_tokens, strict=True)
        if include_best_effort or not o.slo.is_best_effort
    )


@dataclass(frozen=True)
class GoodputSummary:
    requests: int
    attained: int  # request goodput, SLO requests only
    attainment: float
    dslo_tokens: int
    jitserve_tokens: int
    service_gain: float
    service_gain_potential: float
    duration_s: float | None

    def per_second(self, value: float) -> float | None:
        return None if not self.duration_s else value / self.duration_s


def summarize(
    outcomes: Sequence[SloOutcome],
    prompt_tokens: Sequence[int],
    alpha: float = 1.0,
    duration_s: float | None = None,
    weights: GainWeights = DEFAULT_WEIGHTS,
) -> GoodputSummary:
    """Every definition at once, SLO requests only for the counts (gains include best-effort)."""
    return GoodputSummary(
        requests=len(outcomes),
        attained=request_goodput(outcomes, include_best_effort=False),
        attainment=attainment(outcomes),
        dslo_tokens=dslo_token_goodput(outcomes),
        jitserve_tokens=jitserve_token_goodput(outcomes, prompt_tokens),
        service_gain=service_gain_total(outcomes, prompt_tokens, alpha, weights),
        service_gain_potential=service_gain_potential(outcomes, prompt_tokens, weights),
        duration_s=duration_s,
    )
