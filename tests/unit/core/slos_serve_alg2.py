"""SLOs-Serve's Alg. 2 (§3.2.2) as the paper writes it: a helper for the paper-fidelity tests.

The `slos` policy forms its batches through the DP's `TierBudget` and the perf model's `max_batch_within`
(scheduler/core/slos_serve); these literal forms only check the algorithm behaves as described.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from scheduler.core.slos_serve.batch_formation import EPS, BatchShape, prefill_capacity
from scheduler.core.types import PerfModel


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
