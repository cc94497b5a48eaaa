"""Routing-policy registry: adding a policy is one module plus one line in ROUTING_POLICIES."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from router.policies.base import NoWorkerError, RoutingPolicy
from router.policies.cache_aware import CacheAwarePolicy
from router.policies.goodserve import GoodServePolicy
from router.policies.jit import JitPolicy
from router.policies.load_metrics import LeastRequestPolicy, LlumnixLoadPolicy, LowestTpmPolicy
from router.policies.polyserve import PolyServePolicy
from router.policies.slos import SlosRoutingPolicy
from router.policies.spread import PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy

ROUTING_POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    "round_robin": RoundRobinPolicy,
    "random": RandomPolicy,
    "power_of_two": PowerOfTwoPolicy,
    "least_request": LeastRequestPolicy,
    "lowest_tpm": LowestTpmPolicy,
    "cache_aware": CacheAwarePolicy,
    "llumnix_load": LlumnixLoadPolicy,
    "goodserve": GoodServePolicy,
    "polyserve": PolyServePolicy,
    "slos": SlosRoutingPolicy,  # needs admit=: the router passes the core DP's per-replica check
    "jit": JitPolicy,
}

__all__ = ["ROUTING_POLICIES", "NoWorkerError", "RoutingPolicy", "accepted_params", "make_routing_policy"]


def accepted_params(name: str) -> set[str]:
    """Constructor parameters of a routing policy (what the router's flags may set)."""
    return set(inspect.signature(ROUTING_POLICIES[name]).parameters) - {"self"}


def make_routing_policy(name: str, **kwargs: Any) -> RoutingPolicy:
    """Build a policy by name; parameters it does not take are an error, not ignored."""
    try:
        factory = ROUTING_POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; known: {', '.join(sorted(ROUTING_POLICIES))}") from None
    unknown = sorted(set(kwargs) - accepted_params(name))
    if unknown:
        raise ValueError(f"routing policy {name!r} takes no parameter {unknown[0]!r}")
    return factory(**kwargs)
