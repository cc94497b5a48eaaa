"""What every part of the dispatcher shares (llm-d's plugin handle): the workers, the policy,
the sends, the worker secret, the clock, the counters and the limits, passed whole instead of
eight arguments each."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from router.membership import WorkerRegistry
from router.outbox import WorkerOutbox
from router.policies.base import RoutingPolicy
from router.worker_auth import RouterAuth


@dataclass(frozen=True)
class DispatchLimits:
    """How long a request waits and how often it is retried (see Dispatcher's arguments)."""

    max_resubmits: int  # failovers + retries per request
    max_error_retries: int  # a worker's 5xx is retried this often elsewhere
    resume_timeout_s: float  # a request whose worker died waits this long for another
    request_timeout_s: float | None  # no progress this long, over all its workers: 504
    reconcile_grace_s: float  # a placement this young may be missing from a load report


@dataclass(frozen=True)
class DispatchHandle:
    registry: WorkerRegistry
    policy: RoutingPolicy
    outbox: WorkerOutbox
    auth: RouterAuth
    clock: Callable[[], float]  # the router clock the registry and the policies read
    counters: Counter[str]  # the events status() reports
    routed: Counter[str]  # placements per worker, resumes included
    limits: DispatchLimits


class DispatchPart:
    """Base of the dispatcher's parts: the handle's pieces as the part's own attributes, set once
    here so that each part's constructor names only what it adds."""

    def __init__(self, handle: DispatchHandle) -> None:
        self.registry, self.policy, self.outbox = handle.registry, handle.policy, handle.outbox
        self.auth, self.clock, self.counters = handle.auth, handle.clock, handle.counters
        self.routed, self.limits = handle.routed, handle.limits
