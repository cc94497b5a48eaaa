"""SLO-adaptive speculation length (SLOs-Serve §3.2.3, App. D): the one optimiser behind the
slos policy's DP and the engine's speculation controller (scheduler/core/speculation_controller.py).

Speculating s tokens makes a verify step yield Acc(s) = (1−α^(s+1))/(1−α) tokens on average, so
with decode requests in TPOT tiers (TPOT_l, n_l) a batch that verifies `sl_l` drafts for tier l
may last T = min_l TPOT_l·Acc(sl_l): every tier still gets its tokens on time, on average. What
is left of T after the decodes (and the draft passes) is prefill budget. The objective is prefill
tokens per second: long enough batches to amortise the weights' read, not so long that rejected
drafts waste them.

`mixed=True` is the paper's batch: prefill rides in the verify batch, its budget is what fits
beside the decodes in T (Time2BS). SGLang never mixes prefill into a speculative batch: prefill
runs in its own batches, so it gets the time T − exec(s) of every T and the objective becomes
(1 − exec(s)/T(s)) × a full chunk's prefill rate (`mixed=False`, what the engine uses). There a
longer length pays while it shortens decode time per token, exec(s)/Acc(s), and TPOTs bound it
through feasibility and the per-tier lengths.

`choose_uniform` evaluates one length for the whole batch (what SGLang's verify path runs);
`choose_per_tier` is the paper's form (a length per tier). The cost of a batch is a
`SpecStepCost`: the engine's charges draft passes explicitly (scheduler/core/speculation_cost.py); the slos
policy's perf model already charges them (SLOs-Serve's k2·#SpecStep), see `DraftsInModel`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.perf_model import PerfModel, StepTimeModel
from scheduler.core.slos_serve.batch_formation import TOKEN_LIMIT, prefill_capacity

MAX_PREFILL_SEARCH = 16384


def acceptance(steps: int, alpha: float) -> float:
    """Expected tokens emitted per verify step with `steps` speculated tokens."""
    if steps <= 0:
        return 1.0
    if alpha >= 1.0 - 1e-12:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


class SpecStepCost(Protocol):
    def step_time(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, draft_steps: int
    ) -> float:
        """One batch: `spec_tokens` drafted tokens verified on top of one token per decode,
        after `draft_steps` sequential draft passes."""
        ...


@dataclass(frozen=True)
class DraftsInModel:
    """A batch cost for a perf model that already charges the draft passes (through its
    speculative tokens), as the slos policy's model does: no separate draft term."""

    perf: PerfModel

    def step_time(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, draft_steps: int
    ) -> float:
        return self.perf.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)


class _WithDraftSteps(StepTimeModel):
    """A batch cost at a fixed draft depth, as a perf model, for the shared Time2BS."""

    def __init__(self, cost: SpecStepCost, draft_steps: int) -> None:
        self.cost, self.draft_steps = cost, draft_steps

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.cost.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens, self.draft_steps)


@dataclass(frozen=True)
class Tier:
    tpot_s: float
    requests: int


@dataclass(frozen=True)
class LengthChoice:
    steps: int  # the batch's speculation length (max over tiers for per-tier choices)
    batch_time_s: float  # T: the longest batch every tier's TPOT allows at this length
    prefill_budget: int  # prefill tokens that still fit in T
    prefill_rate: float  # prefill tokens per second, the objective
    feasible: bool  # the decodes alone fit in T
    exec_time_s: float = 0.0  # predicted time of the decodes (and drafts) alone
    per_tier: dict[float, int] = field(default_factory=dict)  # TPOT_l -> sl_l


def _evaluate(
    cost: SpecStepCost,
    tiers: Sequence[Tier],
    lengths: Sequence[int],
    alpha: float,
    kv: int,
    limit: int,
    mixed: bool,
    batches_last_t: bool = False,
) -> LengthChoice:
    n = sum(t.requests for t in tiers)
    batch_time = min(t.tpot_s * acceptance(s, alpha) for t, s in zip(tiers, lengths, strict=True))
    spec = sum(t.requests * s for t, s in zip(tiers, lengths, strict=True))
    draft = max(lengths)
    exec_time = cost.step_time(0, n, kv, spec, draft)
    feasible = exec_time <= batch_time
    budget, rate = 0, 0.0
    if feasible and not mixed:
        # prefill runs in its own batches between verifies: it gets T − exec of every T, at the
        # rate of a full prefill chunk (SGLang never puts prefill into a verify batch)
        full = cost.step_time(limit, 0, 0, 0, 0)
        rate = (1.0 - exec_time / batch_time) * limit / full if full > 0 else 0.0
        budget = int(rate * batch_time)
    elif feasible:
        with_drafts = _WithDraftSteps(cost, draft)
        budget = min(limit, int(prefill_capacity(with_drafts, batch_time, n, kv, spec)))
        # The rate ranks on the real-valued budget: integer rounding would make the choice
        # jitter between lengths whose rates are within a token of each other.
        smooth = prefill_capacity(with_drafts, batch_time, n, kv, spec, integral=False)
        if smooth >= limit and not batches_last_t:
            # a budget capped by the engine's chunk limit ends the batch before T: the rate is
            # per the batch's own time then (the paper's budget / T assumes every batch fills T)
            rate = limit / cost.step_time(limit, n, kv, spec, draft)
        else:
            rate = min(smooth, limit) / batch_time
    return LengthChoice(
        steps=draft,
        batch_time_s=batch_time,
        prefill_budget=budget,
        prefill_rate=rate,
        feasible=feasible,
        exec_time_s=exec_time,
        per_tier={t.tpot_s: s for t, s in zip(tiers, lengths, strict=True)},
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


def _clamped(alpha: float) -> float:
    return min(max(alpha, 0.0), 1.0)


def choose_uniform(
    cost: SpecStepCost,
    tiers: Sequence[Tier],
    alpha: float,
    candidates: Iterable[int],
    kv_tokens: int,
    prefill_limit: int = MAX_PREFILL_SEARCH,
    mixed: bool = True,
    batches_last_t: bool = False,
) -> dict[int, LengthChoice]:
    """Every candidate length evaluated for the whole batch (the engine's constraint).

    `batches_last_t`: rate every batch over its full T even when the prefill limit cuts it
    short, as the slos policy's DP accounts its plans (batches of T back to back); by default
    a capped batch ends early and is rated over its own time, as the engine runs it."""
    tiers = [t for t in tiers if t.requests > 0]
    if not tiers:
        return {}
    alpha = _clamped(alpha)
    return {
        s: _evaluate(cost, tiers, [s] * len(tiers), alpha, kv_tokens, prefill_limit, mixed, batches_last_t)
        for s in candidates
    }


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
    cost: SpecStepCost,
    tiers: Sequence[Tier],
    alpha: float,
    candidates: Iterable[int],
    kv_tokens: int,
    prefill_limit: int = MAX_PREFILL_SEARCH,
    mixed: bool = True,
    batches_last_t: bool = False,
) -> LengthChoice | None:
    """SLOs-Serve App. D: enumerate which tier binds the batch time and its length; every other
    tier takes the shortest length that keeps up with that time (`batches_last_t`: as in
    `choose_uniform`)."""
    tiers = [t for t in tiers if t.requests > 0]
    alpha = _clamped(alpha)
    candidates = list(candidates)
    winner = None
    for binding in tiers:
        for s in candidates:
            target = binding.tpot_s * acceptance(s, alpha)
            reaching = [_shortest_reaching(t.tpot_s, target, alpha, candidates) for t in tiers]
            lengths = [sl for sl in reaching if sl is not None]
            if len(lengths) < len(tiers):
                continue  # a tighter tier cannot keep up with this batch time at any length
            choice = _evaluate(cost, tiers, lengths, alpha, kv_tokens, prefill_limit, mixed, batches_last_t)
            if _better(choice, winner):
                winner = choice
    return winner


def optimize_spec_lengths(
    perf: PerfModel,
    tiers: Sequence[Tier],
    alpha: float,
    kv_tokens: int = 0,
    max_steps: int = 8,
    chunk_cap: int | None = None,
    uniform: bool = False,
) -> LengthChoice | None:
    """The slos policy's question: lengths 0..`max_steps` for decoding tiers, prefill riding in
    the verify batch, on a perf model that already charges the drafts. `uniform` forces one
    length for all (SGLang verifies one draft length per batch). None: no decoding tier."""
    cost = DraftsInModel(perf)
    limit = chunk_cap if chunk_cap is not None else TOKEN_LIMIT
    candidates = range(max_steps + 1)
    if uniform:
        return best(choose_uniform(cost, tiers, alpha, candidates, kv_tokens, limit, batches_last_t=True))
    return choose_per_tier(cost, tiers, alpha, candidates, kv_tokens, limit, batches_last_t=True)
