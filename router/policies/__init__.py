"""Routing-policy registry: adding a policy is one module (its class and parameters dataclass)
plus one line in ROUTING_POLICIES."""

from __future__ import annotations

from typing import Any

from router.policies.base import NoWorkerError, RoutingContext, RoutingPolicy
from router.policies.cache_aware import CacheAwareParams, CacheAwarePolicy
from router.policies.goodserve import GoodServeParams, GoodServePolicy
from router.policies.jit import JitParams, JitPolicy
from router.policies.load_metrics import LeastRequestPolicy, LlumnixLoadPolicy, LowestTpmPolicy
from router.policies.polyserve import PolyServeParams, PolyServePolicy
from router.policies.slos_routing import SlosRoutingParams, build_slos_routing
from router.policies.spread import PowerOfTwoPolicy, RandomPolicy, RoundRobinPolicy, SeedParams
from scheduler.core.registry import Entry, NoParams, Registry

ROUTING_POLICIES: Registry[RoutingContext, RoutingPolicy] = Registry(
    "routing policy",
    [
        Entry("round_robin", NoParams, lambda p, ctx: RoundRobinPolicy()),
        Entry("random", SeedParams, lambda p, ctx: RandomPolicy(p)),
        Entry("power_of_two", SeedParams, lambda p, ctx: PowerOfTwoPolicy(p)),
        Entry("least_request", NoParams, lambda p, ctx: LeastRequestPolicy()),
        Entry("lowest_tpm", NoParams, lambda p, ctx: LowestTpmPolicy()),
        Entry("cache_aware", CacheAwareParams, lambda p, ctx: CacheAwarePolicy(p)),
        Entry("llumnix_load", NoParams, lambda p, ctx: LlumnixLoadPolicy()),
        Entry("goodserve", GoodServeParams, lambda p, ctx: GoodServePolicy(p)),
        Entry("polyserve", PolyServeParams, lambda p, ctx: PolyServePolicy(p)),
        Entry("slos", SlosRoutingParams, build_slos_routing),
        Entry("jit", JitParams, lambda p, ctx: JitPolicy(p)),
    ],
)

__all__ = [
    "ROUTING_POLICIES",
    "NoWorkerError",
    "RoutingContext",
    "RoutingPolicy",
    "accepted_params",
    "make_routing_policy",
]


def accepted_params(name: str) -> tuple[str, ...]:
    """What --routing-policy-param may set for `name`."""
    return ROUTING_POLICIES.param_names(name)


def make_routing_policy(name: str, context: RoutingContext | None = None, **params: Any) -> RoutingPolicy:
    """Build a policy by name from plain parameter values (checked: a parameter it does not take,
    a wrong type or an out-of-range value is a ParamError naming the field). `context` is what
    the router knows; without one, a policy that reads in-flight requests sees none."""
    return ROUTING_POLICIES.make(name, params, context if context is not None else RoutingContext())
