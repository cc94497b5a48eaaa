"""Which prompt-prefix blocks were recently sent to which worker: the router's view of each
worker's prefix cache (SGLang-router style), bounded so it cannot grow with traffic.

Each worker keeps an LRU of block hashes; a global index hash -> workers lets one walk over the
request's hashes find every worker's leading-match length without touching the workers that
share nothing with it (the common case at 512 workers).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence

DEFAULT_MAX_BLOCKS = 4096  # per worker: ~256k tokens of 64-token blocks, far more than most KV caches


class PrefixTable:
    """Bounded per-worker LRU of prefix-block hashes with a reverse index."""

    def __init__(self, max_blocks_per_worker: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks_per_worker <= 0:
            raise ValueError("max_blocks_per_worker must be positive")
        self.max_blocks = max_blocks_per_worker
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._holders: dict[int, set[str]] = {}

    def record(self, worker_id: str, hashes: Iterable[int]) -> None:
        """The prompt with these leading-block hashes was sent to `worker_id`."""
        lru = self._lru.setdefault(worker_id, OrderedDict())
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = None
            self._holders.setdefault(h, set()).add(worker_id)
            if len(lru) > self.max_blocks:
                old, _ = lru.popitem(last=False)
                self._drop(old, worker_id)

    def forget(self, worker_id: str) -> None:
        """The worker left or restarted: its cache is gone."""
        for h in self._lru.pop(worker_id, ()):
            self._drop(h, worker_id)

    def matches(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of `hashes` each worker holds, for workers holding at least one."""
        out: dict[str, int] = {}
        if not hashes:
            return out
        alive = set(self._holders.get(hashes[0], ()))
        depth = 0
        while alive:
            depth += 1
            if depth == len(hashes):
                break
            nxt = self._holders.get(hashes[depth], set())
            for wid in alive - nxt:
                out[wid] = depth
            alive &= nxt
        for wid in alive:
            out[wid] = depth
        return out

    def blocks(self, worker_id: str) -> int:
        return len(self._lru.get(worker_id, ()))

    def _drop(self, h: int, worker_id: str) -> None:
        holders = self._holders.get(h)
        if holders is not None:
            holders.discard(worker_id)
            if not holders:
                del self._holders[h]
