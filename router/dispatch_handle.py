"""What every part of the dispatcher shares (llm-d's plugin handle): the workers, the policy,
the sends, the clock and the counters, passed whole instead of six arguments each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from router.outbox import WorkerOutbox
from router.policies.base import RoutingPolicy
from router.registry import WorkerRegistry


@dataclass(frozen=True)
class DispatchHandle:
    registry: WorkerRegistry
    policy: RoutingPolicy
    outbox: WorkerOutbox
    clock: Callable[[], float]  # the router clock the registry and the policies read
    counters: Counter[str]  # the events status() reports
    routed: Counter[str]  # placements per worker, resumes included
