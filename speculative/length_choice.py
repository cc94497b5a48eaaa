"""SLOs-Serve's speculation-length optimiser (§3.2.3, App. D).

With decode requests in TPOT tiers (TPOT_l, n_l), a batch that verifies `sl_l` drafts for tier l
may last T = min_l TPOT_l·Acc(sl_l): every tier still gets its tokens on time, on average. What is
left of T after the decodes (and the draft passes) is prefill budget. The objective is prefill
tokens per second, budget / T: long enough batches to amortise the weights' read, not so long
that rejected drafts waste them.

`mixed=True` is the paper's batch: prefill rides in the verify batch, its budget is what fits
beside the decodes in T. SGLang never mixes prefill into a speculative batch: prefill runs in
its own batches, so it gets the time T − exec(s) of every T and the objective becomes
(1 − exec(s)/T(s)) × a full chunk's prefill rate (`mixed=False`, what the engine uses). There a
longer length pays while it shortens decode time per token, exec(s)/Acc(s), and TPOTs bound it
through feasibility and the per-tier lengths.

`choose_uniform` solves it for one length per batch, which is what SGLang's verify path runs.
`choose_per_tier` is the paper's form (a length per tier); we report it beside the one we run.

The policy core's `optimize_spec_lengths` (scheduler/core/slos_serve/spec_length.py) answers the
same question inside the slos policy's DP, with a fixed α and the draft folded into the perf
model. The engine needs more: the lengths SGLang pre-built runtime states for, an explicit draft
cost, and which lengths would miss a TPOT outright (to leave them at once). Both share Acc(s)
and Time2BS.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from scheduler.core.slos_serve.batch_formation import prefill_capacity
from scheduler.core.slos_serve.spec_length import acceptance
from speculative.cost import SpecCost

MAX_PREFILL_SEARCH = 16384


@dataclass(frozen=True)
class Tier:
    tpot_s: float
    requests: int


@dataclass(frozen=True)
class LengthChoice:
    steps: int  # the batch's speculation length (max over tiers for per-tier choices)
    batch_time_s: float  # T: the longest batch every tier's TPOT allows at this length
    prefill_budget: int  # prefill tokens that still fit in T
    prefill_rate: float  # budget / T, the objective
    feasible: bool  # the decodes alone fit in T
    exec_time_s: float = 0.0  # predicted time of the decodes (and drafts) alone
    per_tier: dict[float, int] = field(default_factory=dict)  # TPOT_l -> sl_l


class _Drafting:
    """The perf-model interface with the batch's draft passes added, for the shared Time2BS."""

    def __init__(self, cost: SpecCost, draft_steps: int) -> None:
        self.cost, self.draft_steps = cost, draft_steps

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.cost.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens, self.draft_steps)


def _evaluate(
    cost: SpecCost, tiers: Sequence[Tier], lengths: Sequence[int], alpha: float, kv: int, limit: int, mixed: bool
) -> LengthChoice:
    n = sum(t.requests for t in tiers)
    batch_time = min(t.tpot_s * acceptance(s, alpha) for t, s in zip(tiers, lengths))
    spec = sum(t.requests * s for t, s in zip(tiers, lengths))
    draft = max(lengths)
    exec_time = cost.step_time(0, n, kv, spec, draft)
    feasible = exec_time <= batch_time
    if not mixed:
        # prefill runs in its own batches between verifies: it gets T − exec of every T, at the
        # rate of a full prefill chunk (SGLang never puts prefill into a verify batch)
        full = cost.step_time(limit, 0, 0, 0, 0)
        rate = (1.0 - exec_time / batch_time) * limit / full if feasible and full > 0 else 0.0
        budget = int(rate * batch_time)
    else:
        # SLOs-Serve's Time2BS (the policy core's), on the batch's cost including its drafts
        budget = min(limit, int(prefill_capacity(_Drafting(cost, draft), batch_time, n, kv, spec))) if feasible else 0
        # a budget capped by the engine's chunk limit ends the batch before T: the rate is per the
        # batch's own time then (the paper's budget / T assumes every batch fills T)
        took = cost.step_time(budget, n, kv, spec, draft) if budget > 0 else batch_time
        rate = budget / took if took > 0 else 0.0
    return LengthChoice(
        steps=draft,
        batch_time_s=batch_time,
        prefill_budget=budget,
        prefill_rate=rate,
        feasible=feasible,
        exec_time_s=exec_time,
        per_tier={t.tpot_s: s for t, s in zip(tiers, lengths)},
    )


def _better(a: LengthChoice, b: LengthChoice | None) -> bool:
    """Feasible beats infeasible; then the objective; an infeasible pair by the smaller overrun;
    ties keep the shorter length (fewer wasted drafts)."""
    if b is None:
        return True
    if a.feasible != b.feasible:
        return a.feasible
    if a.feasible:
        if a.prefill_rate != b.prefill_rate:
            return a.prefill_rate > b.prefill_rate
        return a.steps < b.steps
    return a.exec_time_s / a.batch_time_s < b.exec_time_s / b.batch_time_s


def choose_uniform(
    cost: SpecCost,
    tiers: Sequence[Tier],
    alpha: float,
    candidates: Sequence[int],
    kv_tokens: int,
    prefill_limit: int = MAX_PREFILL_SEARCH,
    mixed: bool = True,
) -> dict[int, LengthChoice]:
    """Every candidate length evaluated for the whole batch (the engine's constraint)."""
    tiers = [t for t in tiers if t.requests > 0]
    if not tiers:
        return {}
    return {s: _evaluate(cost, tiers, [s] * len(tiers), alpha, kv_tokens, prefill_limit, mixed) for s in candidates}


def best(choices: dict[int, LengthChoice]) -> LengthChoice | None:
    winner = None
    for choice in choices.values():
        if _better(choice, winner):
            winner = choice
    return winner


def _shortest_reaching(tpot_s: float, target_s: float, alpha: float, candidates: Sequence[int]) -> int | None:
    """App. D's closed form, over the candidates: the fewest drafts for which this tier's own
    allowance TPOT·Acc(s) still covers the batch time."""
    for s in sorted(candidates):
        if tpot_s * acceptance(s, alpha) >= target_s - 1e-12:
            return s
    return None


def choose_per_tier(
    cost: SpecCost,
    tiers: Sequence[Tier],
    alpha: float,
    candidates: Sequence[int],
    kv_tokens: int,
    prefill_limit: int = MAX_PREFILL_SEARCH,
    mixed: bool = True,
) -> LengthChoice | None:
    """SLOs-Serve App. D: enumerate which tier binds the batch time and its length; every other
    tier takes the shortest length that keeps up with that time."""
    tiers = [t for t in tiers if t.requests > 0]
    winner = None
    for binding in tiers:
        for s in candidates:
            target = binding.tpot_s * acceptance(s, alpha)
            lengths = [_shortest_reaching(t.tpot_s, target, alpha, candidates) for t in tiers]
            if any(sl is None for sl in lengths):
                continue  # a tighter tier cannot keep up with this batch time at any length
            choice = _evaluate(cost, tiers, lengths, alpha, kv_tokens, prefill_limit, mixed)  # type: ignore[arg-type]
            if _better(choice, winner):
                winner = choice
    return winner
