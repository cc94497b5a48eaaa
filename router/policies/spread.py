"""Load-oblivious spreading baselines: round robin, random, and power of two choices.

They ignore SLOs on purpose; they are the classical baselines GoodServe compares against.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from router.policies.base import RoutingPolicy, healthy_workers
from router.routing_views import Decision, RouteRequest, WorkerView


@dataclass(frozen=True)
class SeedParams:
    seed: int = 0  # of the policy's own random stream, so runs are reproducible


class RoundRobinPolicy(RoutingPolicy):
    """Cycle over the healthy workers in the order the router lists them."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        w = alive[self._next % len(alive)]
        self._next += 1
        return Decision(w.worker_id, reason="round_robin")


class RandomPolicy(RoutingPolicy):
    """Uniformly random healthy worker; seeded so runs are reproducible."""

    name = "random"

    def __init__(self, params: SeedParams = SeedParams()) -> None:
        self._rng = random.Random(params.seed)

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        return Decision(self._rng.choice(healthy_workers(workers)).worker_id, reason="random")


class PowerOfTwoPolicy(RoutingPolicy):
    """Two distinct random healthy workers, the less loaded wins (the first drawn on ties)."""

    name = "power_of_two"

    def __init__(self, params: SeedParams = SeedParams()) -> None:
        self._rng = random.Random(params.seed)

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        if len(alive) == 1:
            return Decision(alive[0].worker_id, reason="power_of_two")
        a, b = self._rng.sample(alive, 2)
        w = b if b.load < a.load else a
        return Decision(w.worker_id, reason="power_of_two", detail={"load": float(w.load)})
