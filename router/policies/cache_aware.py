"""Prefix-cache-aware routing in the style of SGLang's router: follow the prompt's prefix to the
worker that most likely still caches it, unless that would pile work onto an overloaded worker.

The router cannot see the workers' radix caches, so it remembers which prefix blocks it sent
where (PrefixTable, bounded per worker). A request goes to the worker with the longest leading
match when the matched share of its blocks is at least `cache_threshold` and that worker is not
overloaded relative to the least loaded one; otherwise to the least loaded worker (which then
starts caching this prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from router.policies.base import RoutingPolicy, healthy_workers, least_loaded
from router.policies.prefix_table import DEFAULT_MAX_BLOCKS, PrefixTable
from router.routing_views import Decision, RouteRequest, WorkerView


@dataclass(frozen=True)
class CacheAwareParams:
    cache_threshold: float = 0.5  # matched share of the prompt's blocks that follows the cache
    balance_abs_threshold: int = 8
    balance_rel_threshold: float = 1.5
    max_blocks_per_worker: int = DEFAULT_MAX_BLOCKS


class CacheAwarePolicy(RoutingPolicy):
    name = "cache_aware"

    def __init__(self, params: CacheAwareParams = CacheAwareParams()) -> None:
        self.params = params
        self.table = PrefixTable(params.max_blocks_per_worker)

    def forget_worker(self, worker_id: str) -> None:
        self.table.forget(worker_id)

    def overloaded(self, load: int, min_load: int) -> bool:
        """Both gaps must be exceeded, so small clusters at low load still follow the cache."""
        p = self.params
        return load - min_load > p.balance_abs_threshold and load > p.balance_rel_threshold * min_load

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        idle = least_loaded(alive)
        hashes = req.prefix_hashes
        matched = self.table.matches(hashes) if hashes else {}
        best: WorkerView | None = None
        best_blocks = 0
        if matched:
            for w in alive:
                blocks = matched.get(w.worker_id, 0)
                if blocks > best_blocks or (blocks == best_blocks and best is not None and w.load < best.load):
                    best, best_blocks = w, blocks
        share = best_blocks / len(hashes) if hashes else 0.0
        if best is not None and share >= self.params.cache_threshold and not self.overloaded(best.load, idle.load):
            chosen, reason = best, "prefix_match"
        else:
            chosen, reason = idle, "least_loaded"
        self.table.record(chosen.worker_id, hashes)
        return Decision(chosen.worker_id, reason=reason, detail={"match_share": share})

    def on_routed(self, req: RouteRequest, worker_id: str) -> None:
        self.table.record(worker_id, req.prefix_hashes)
