"""Batch formation with dynamic batch size (SLOs-Serve §3.2.2, Alg. 2).

The tightest TPOT among decoding requests sets the batch time; the batch is then as large as
the perf model allows within that time, and whatever the decodes leave is prefill budget.
Larger batches have higher token throughput, so this beats a global Sarathi-style cap.
Each decoding request takes one token per batch (what SGLang does without speculation).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
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
        return perf.step_time(p, decode_reqs, kv_tokens, spec_tokens) <= batch_time + EPS  # type: ignore[arg-type]

    if not fits(0):
        over = perf.step_time(0, decode_reqs, kv_tokens, spec_tokens) - batch_time
        return -1.0 - over  # more negative = further from fitting
    if integral:
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


def form_batch(
    perf: PerfModel,
    decode_tpots: Iterable[float | None],
    kv_tokens: int = 0,
    chunk_cap: int | None = None,
    idle_batch_s: float = 0.05,
) -> BatchShape:
    """Alg. 2 line 1 and its budget: batch time = tightest TPOT among decoders (None = no
    TPOT target). With no TPOT to keep, the batch is a full chunk (or `idle_batch_s`)."""
    tpots = list(decode_tpots)
    decode_reqs = len(tpots)
    targets = [t for t in tpots if t is not None]
    if not targets:
        if chunk_cap is not None:
            return BatchShape(perf.step_time(chunk_cap, decode_reqs, kv_tokens), decode_reqs, float(chunk_cap))
        t0 = idle_batch_s
    else:
        t0 = min(targets)
    budget = prefill_capacity(perf, t0, decode_reqs, kv_tokens)
    if chunk_cap is not None:
        budget = min(budget, float(chunk_cap))
    return BatchShape(t0, decode_reqs, budget)


@dataclass
class PartialBatch:
    decode_rids: list[str]
    prefill_budget: int


def alg2_batches(
    horizon: float,
    decoders: Sequence[tuple[str, float]],
    perf: PerfModel,
    kv_tokens: int = 0,
) -> list[PartialBatch]:
    """Alg. 2 as written: batches of the tightest TPOT t0 over `horizon`, each with the total
    token budget Time2BS(t0); decode tokens go out earliest scheduled deadline first (a
    request is served when its next token falls due within the batch), the rest is prefill."""
    if not decoders:
        return []
    t0 = min(tpot for _, tpot in decoders)
    total = int(prefill_capacity(perf, t0, 0, kv_tokens))
    queue = [(0.0, i, rid, tpot) for i, (rid, tpot) in enumerate(decoders)]
    heapq.heapify(queue)
    batches = []
    for i in range(int(math.floor(horizon / t0 + EPS))):
        batch = PartialBatch([], total)
        while queue and queue[0][0] <= i * t0 + EPS and batch.prefill_budget > 0:
            due, order, rid, tpot = heapq.heappop(queue)
            batch.decode_rids.append(rid)
            batch.prefill_budget -= 1
            heapq.heappush(queue, (due + tpot, order, rid, tpot))
        batches.append(batch)
    return batches
