"""SLO-adaptive speculation length (SLOs-Serve §3.2.3, App. D).

Speculating s tokens makes a verify step yield Acc(s) = (1−α^(s+1))/(1−α) tokens on average,
so a decoder with TPOT τ tolerates a batch time of τ·Acc(s). Longer batches carry more
prefill, but every speculated token also costs batch tokens. We pick the lengths that
maximise prefill budget per unit time; with a linear step model the choice is
non-decreasing in α and, where batch time (not the chunk cap) binds, independent of τ.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from scheduler.core.slos_serve.batch_formation import prefill_capacity
from scheduler.core.types import PerfModel

EPS = 1e-12


def acceptance(steps: int, alpha: float) -> float:
    """Expected tokens emitted per verify step with `steps` speculated tokens."""
    if steps <= 0:
        return 1.0
    if alpha >= 1.0 - 1e-12:
        return float(steps + 1)
    return (1.0 - alpha ** (steps + 1)) / (1.0 - alpha)


@dataclass(frozen=True)
class SpecChoice:
    steps: tuple[int, ...]  # per tier, in the order the tiers were given
    batch_time: float
    prefill_budget: float  # < 0: even the best choice overruns the TPOTs

    @property
    def rate(self) -> float:
        """Prefill tokens per second this choice leaves."""
        return self.prefill_budget / self.batch_time if self.batch_time > 0 else -float("inf")

    @property
    def max_steps(self) -> int:
        return max(self.steps, default=0)


def _evaluate(
    perf: PerfModel,
    tiers: Sequence[tuple[float, int]],
    steps: Sequence[int],
    batch_time: float,
    kv_tokens: int,
    chunk_cap: int | None,
) -> SpecChoice:
    decode_reqs = sum(n for _, n in tiers)
    spec_tokens = sum(n * s for (_, n), s in zip(tiers, steps, strict=True))
    budget = prefill_capacity(perf, batch_time, decode_reqs, kv_tokens, spec_tokens, integral=False)
    if chunk_cap is not None:
        budget = min(budget, float(chunk_cap))
    return SpecChoice(tuple(steps), batch_time, budget)


def _fewest_steps(tpot: float, batch_time: float, alpha: float, max_steps: int) -> int | None:
    """Shortest speculation letting a decoder with this TPOT keep up with `batch_time`."""
    for s in range(max_steps + 1):
        if tpot * acceptance(s, alpha) >= batch_time * (1 - 1e-12):
            return s
    return None


def optimize_spec_lengths(
    perf: PerfModel,
    tiers: Sequence[tuple[float, int]],
    alpha: float,
    kv_tokens: int = 0,
    max_steps: int = 8,
    chunk_cap: int | None = None,
    uniform: bool = False,
) -> SpecChoice:
    """Speculation lengths for decoding tiers [(tpot_s, count)] maximising prefill budget per
    second. App. D: enumerate the tier whose TPOT·Acc(s) binds the batch time and its s; every
    other tier then needs only the fewest steps that keep up. `uniform` forces one length for
    all (SGLang verifies one draft length per batch). Ties keep the shorter speculation."""
    alpha = min(max(alpha, 0.0), 1.0)
    active = [(tpot, n) for tpot, n in tiers if n > 0]
    if not active:
        return SpecChoice(tuple(0 for _ in tiers), 0.0, 0.0)
    best: SpecChoice | None = None
    t_min = min(tpot for tpot, _ in active)
    if uniform:
        for s in range(max_steps + 1):
            cand = _evaluate(perf, tiers, [s] * len(tiers), t_min * acceptance(s, alpha), kv_tokens, chunk_cap)
            if best is None or cand.rate > best.rate + EPS * abs(best.rate):
                best = cand
        assert best is not None
        return best
    for tpot_b, _ in active:
        for s_b in range(max_steps + 1):
            batch_time = tpot_b * acceptance(s_b, alpha)
            steps = []
            for tpot, n in tiers:
                s = _fewest_steps(tpot, batch_time, alpha, max_steps) if n > 0 else 0
                if s is None:
                    break
                steps.append(s)
            else:
                cand = _evaluate(perf, tiers, steps, batch_time, kv_tokens, chunk_cap)
                better = best is None or cand.rate > best.rate + EPS * abs(best.rate)
                tie = best is not None and not better and abs(cand.rate - best.rate) <= EPS * abs(best.rate)
                if better or (tie and sum(cand.steps) < sum(best.steps)):
                    best = cand
    assert best is not None  # the tightest tier with s=0 is always a candidate
    return best
