"""Batches short enough for the requests still to arrive (the overlap schedule's cost).

SLOs-Serve's Alg. 2 makes every batch as long as the tightest TPOT allows, which with a loose
TPOT means a prefill chunk of thousands of tokens. Under SGLang's overlap schedule a request
that arrives during a pass is first planned after the next pass, so two such passes go by
before its own: a short prompt's TTFT is spent before admission ever sees it, and the DP then
declines it. Bounding each batch's prefill to what fills a share of the tightest TTFT in view
keeps the TPOT (a shorter batch only decodes more often) and trades a little throughput for
the arrivals' first tokens.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.core.slos_serve.batch_formation import BatchShape, prefill_capacity
from scheduler.core.slos_serve.dp import Counts, TierBudget
from scheduler.core.types import PerfModel

MIN_CHUNK_TOKENS = 64  # a bound below this would starve long prompts of progress


def arrival_chunk(perf: PerfModel, ttft_ms: np.ndarray, share: float | None) -> float:
    """Prefill tokens one batch may carry so it lasts `share` of the tightest TTFT (ms, nan:
    none) by itself; inf when there is no bound."""
    if share is None:
        return math.inf
    known = ttft_ms[~np.isnan(ttft_ms)]
    if known.size == 0:
        return math.inf
    return max(float(MIN_CHUNK_TOKENS), prefill_capacity(perf, share * float(known.min()) / 1000.0, 0))


class ArrivalBoundBudget(TierBudget):
    """TierBudget whose batches carry at most `chunk_bound` prefill tokens: a bounded batch is
    shorter than the TPOT's (stability is the TPOT's, unchanged), so more of them fit an
    interval. `tpot_shape` is the unbounded one (the batch cap keeps the TPOT, not this)."""

    def __init__(self, perf: PerfModel, tier_tpots: Sequence[float], chunk_bound: float, **kw: object) -> None:
        super().__init__(perf, tier_tpots, **kw)  # type: ignore[arg-type]
        self.chunk_bound = chunk_bound

    def tpot_shape(self, counts: Counts) -> BatchShape:
        return super()._shape(counts)

    def _shape(self, counts: Counts) -> BatchShape:
        shape = super()._shape(counts)
        if not shape.stable or shape.prefill_budget <= self.chunk_bound:
            return shape
        n, steps = shape.decode_reqs, shape.spec_steps
        t = self.perf.step_time(self.chunk_bound, n, self.kv, n * steps)  # type: ignore[arg-type]
        return BatchShape(min(t, shape.batch_time), n, float(self.chunk_bound), steps)
