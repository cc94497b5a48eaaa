"""Baselines that pick the best worker by one load metric (AIBrix least-request, LiteLLM
lowest-TPM, Llumnix most-free-memory), as GoodServe's evaluation describes them."""

from __future__ import annotations

from collections.abc import Sequence

from router.policies.base import RoutingPolicy, healthy_workers, least_loaded
from router.routing_views import Decision, RouteRequest, WorkerView


class LeastRequestPolicy(RoutingPolicy):
    """Fewest requests on the worker (in-flight as the router knows it, or queued + running)."""

    name = "least_request"

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        w = least_loaded(healthy_workers(workers))
        return Decision(w.worker_id, reason="least_request", detail={"load": float(w.load)})


class LowestTpmPolicy(RoutingPolicy):
    """Lowest tokens served over the last minute; fewer requests breaks ties."""

    name = "lowest_tpm"

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        w = min(healthy_workers(workers), key=lambda v: (v.tokens_per_minute, v.load))
        return Decision(w.worker_id, reason="lowest_tpm", detail={"tpm": w.tokens_per_minute})


class LlumnixLoadPolicy(RoutingPolicy):
    """Most free KV-cache tokens (Llumnix's memory-based dispatch); fewer requests breaks ties."""

    name = "llumnix_load"

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        w = min(healthy_workers(workers), key=lambda v: (-v.kv_free_tokens, v.load))
        return Decision(w.worker_id, reason="llumnix_load", detail={"kv_free_tokens": float(w.kv_free_tokens)})
