"""Batch formation with dynamic batch size (SLOs-Serve §3.2.2, Alg. 2).

The tightest TPOT among decoding requests sets the batch time; the batch is then as large as
the perf model allows within that time, and whatever the decodes leave is prefill budget.
Larger batches have higher token throughput, so this beats a global Sarathi-style cap.
Each decoding request takes one token per batch (what SGLang does without speculation).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.core.perf_model import PerfModel, largest_fitting

EPS = 1e-9
TOKEN_LIMIT = 1 << 22  # a bound on tokens per batch, far above any real chunk size


def prefill_capacity(
    perf: PerfModel,
    batch_time: float,
    decode_reqs: int,
    kv_tokens: int = 0,
    spec_tokens: int = 0,
    integral: bool = True,
) -> float:
    """Most prefill tokens that fit in `batch_time` beside these decodes (the paper's
    Time2BS). Negative when even the decodes alone overrun it: their TPOT cannot hold.
    `integral=False` bisects to a real number, which keeps optimisers over it smooth."""

    def fits(p: float) -> bool:
        # The real-valued bisection probes between whole token counts: every model's step_time
        # is plain float arithmetic, so a fractional count is meaningful there.
        return perf.step_time(p, decode_reqs, kv_tokens, spec_tokens) <= batch_time + EPS  # type: ignore[arg-type]

    if not fits(0):
        over = perf.step_time(0, decode_reqs, kv_tokens, spec_tokens) - batch_time
        return -1.0 - over  # more negative = further from fitting
    if integral:
        within = getattr(perf, "max_prefill_within", None)  # a model that can solve for it (fakes: search)
        if within is not None:
            return float(within(batch_time + EPS, decode_reqs, kv_tokens, spec_tokens, TOKEN_LIMIT))
        return float(largest_fitting(fits, TOKEN_LIMIT))
    lo, hi = 0.0, 1.0
    while fits(hi):
        lo, hi = hi, hi * 2
        if hi > TOKEN_LIMIT:
            return float(TOKEN_LIMIT)
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi - lo < 1e-9 * max(1.0, abs(hi)):
            break
    return lo


@dataclass(frozen=True)
class BatchShape:
    """One planned batch: its time, its decoders and the prefill tokens it can carry."""

    batch_time: float
    decode_reqs: int
    prefill_budget: float  # < 0: the decodes alone overrun batch_time (unstable)
    spec_steps: int = 0

    @property
    def stable(self) -> bool:
        return self.prefill_budget >= 0

    @property
    def decode_cap(self) -> int:
        """The most decoders a batch of this time could hold (one token each, no prefill)."""
        return self.decode_reqs + max(0, int(self.prefill_budget))
