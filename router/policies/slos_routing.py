"""SLOs-Serve multi-replica routing (§4.2): sequential admission over replicas.

Each replica's scheduler decides whether it can still meet the request's SLOs (the core's
multi-SLO DP run on that replica's virtualised state); a refused request is passed to the next
replica, and after `limit` refusals a backup policy serves it best effort on the least loaded
replica. The router injects `admit(req, worker) -> bool`, so this module stays a pure ordering
rule. The order is fixed per decision: ascending load (default), or `order="round_robin"`, the
paper's evaluation setup (a one-shot round-robin dispatcher picks the first replica, refusals go
to the next ones in list order). Requests without an SLO skip admission (there is nothing to
guarantee) and go to the least loaded replica.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from router.policies.base import RoutingContext, RoutingPolicy, healthy_workers, least_loaded
from router.policies.slos_admission import AdmissionParams, ReplicaAdmission
from router.routing_views import Decision, RouteRequest, WorkerView
from scheduler.core.registry import require

AdmitFn = Callable[[RouteRequest, WorkerView], bool]
ORDERS = ("load", "round_robin")


@dataclass(frozen=True)
class SlosRoutingParams(AdmissionParams):
    """The routing rule's own parameters plus its per-replica admission check's."""

    limit: int | None = None  # refusals before the best-effort fallback; None: ask every replica
    order: str = "load"

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.order in ORDERS, "order", f"must be one of {', '.join(ORDERS)}", self.order)
        require(
            self.limit is None or self.limit >= 1,
            "limit",
            "must be at least 1 (or None: ask every replica)",
            self.limit,
        )


class SlosRoutingPolicy(RoutingPolicy):
    name = "slos"

    def __init__(self, admit: AdmitFn, params: SlosRoutingParams = SlosRoutingParams()) -> None:
        self.admit = admit
        self.limit = params.limit
        self.order = params.order
        self._next = 0

    def sequence(self, alive: list[WorkerView]) -> list[WorkerView]:
        """The replicas in the order they are asked."""
        if self.order == "load":
            return sorted(alive, key=lambda w: w.load)
        start = self._next % len(alive)
        self._next += 1
        return alive[start:] + alive[:start]

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        if req.slo.is_best_effort:
            return Decision(least_loaded(alive).worker_id, reason="no_slo_least_loaded")
        limit = len(alive) if self.limit is None else min(self.limit, len(alive))
        for refusals, w in enumerate(self.sequence(alive)[:limit]):
            if self.admit(req, w):
                return Decision(w.worker_id, reason="admitted", detail={"refusals": float(refusals)})
        w = least_loaded(alive)
        return Decision(w.worker_id, reason="refused_everywhere", best_effort=True, detail={"refusals": float(limit)})


def build_slos_routing(params: SlosRoutingParams, context: RoutingContext) -> SlosRoutingPolicy:
    """The routing rule over SLOs-Serve's per-replica admission on the router's in-flight view."""
    return SlosRoutingPolicy(ReplicaAdmission(context.running_on, params, clock=context.clock), params)
