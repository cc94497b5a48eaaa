"""The routing-policy contract: what the router calls, and what a policy may and may not do.

A policy is a pure-Python object that maps (request, worker snapshots, clock) to a Decision. It
never does I/O, never blocks and never reads SGLang: the same object runs in the router, in
unit tests and in simulators, and it is timed at 8, 64 and 512 workers (benchmarks/experiments/decision_latency.py), so
`choose` should stay O(workers) with small constants.

Contract:
- `choose(req, workers, now)` considers only healthy workers and raises NoWorkerError when none
  is left. It may update the policy's own small state (a round-robin pointer, a prefix table,
  tier bookkeeping): the router treats every returned Decision as a placement it carries out.
- `on_routed(req, worker_id)` tells the policy about a placement it did not choose itself (an
  executed migration, a pinned program stage). `choose` already records its own decisions.
- `on_finished(rid, worker_id)` releases per-request state; policies that count requests per
  worker (PolyServe's tiers) rely on it.
- `migrations(running, workers, now)` returns (rid, target worker) moves; the router calls it
  once per tick and executes the moves (token-ID re-prefill on the target), then calls
  `on_routed` for each. The default is no migration.
- `forget_worker(worker_id)` drops per-worker state once a worker is gone for good, so a pool
  that churns does not grow the policy.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.routing_views import Decision, RouteRequest, RunningView, WorkerView


class NoWorkerError(RuntimeError):
    """No healthy worker to route to; the router answers 503 rather than guessing."""


def _nothing_running(worker_id: str) -> Sequence[RunningView]:
    return ()


@dataclass(frozen=True)
class RoutingContext:
    """What the router hands a policy's factory: its in-flight requests per worker and its clock
    (the one RouteRequest.arrival_s is stamped with). Policies that need neither ignore it."""

    running_on: Callable[[str], Sequence[RunningView]] = _nothing_running
    clock: Callable[[], float] = time.monotonic


def healthy_workers(workers: Sequence[WorkerView]) -> list[WorkerView]:
    """The candidates of a decision, in the caller's order (ties break by that order)."""
    alive = [w for w in workers if w.healthy]
    if not alive:
        raise NoWorkerError(f"no healthy worker among {len(workers)}")
    return alive


def least_loaded(workers: Sequence[WorkerView]) -> WorkerView:
    """Fewest requests, first in order on ties: the shared fallback of the SLO-aware policies."""
    return min(workers, key=lambda w: w.load)


class RoutingPolicy(ABC):
    """Base class of every router policy; subclasses set `name` and implement `choose`."""

    name: str = ""

    @abstractmethod
    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        """Pick a healthy worker for `req` (raise NoWorkerError when there is none)."""

    def on_routed(self, req: RouteRequest, worker_id: str) -> None:  # noqa: B027 - optional hook
        """A placement this policy did not choose (migration, pinned stage); default: ignore."""

    def on_finished(self, rid: str, worker_id: str) -> None:  # noqa: B027 - optional hook
        """`rid` left `worker_id` (finished, aborted or migrated away); default: ignore."""

    def migrations(
        self, running: Sequence[RunningView], workers: Sequence[WorkerView], now: float
    ) -> list[tuple[str, str]]:
        """(rid, target worker) moves to make now; default: none."""
        return []

    def forget_worker(self, worker_id: str) -> None:  # noqa: B027 - optional hook
        """The worker is gone for good (dead past the router's TTL): drop what is kept about it."""
