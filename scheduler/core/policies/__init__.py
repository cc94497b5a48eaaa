"""Policy registry: adding a policy is one module plus one line in POLICIES."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scheduler.core.policies.edf import EdfPolicy
from scheduler.core.policies.fcfs import FcfsPolicy
from scheduler.core.policies.gmax import GmaxPolicy
from scheduler.core.policies.las import LasPolicy
from scheduler.core.policies.sarathi import SarathiPolicy
from scheduler.core.policies.sjf import SjfPolicy
from scheduler.core.policies.slos import SlosServePolicy
from scheduler.core.policies.tempo import TempoPolicy
from scheduler.core.types import Policy

POLICIES: dict[str, Callable[..., Policy]] = {
    "fcfs": FcfsPolicy,
    "edf": EdfPolicy,
    "sjf": SjfPolicy,
    "las": LasPolicy,
    "sarathi": SarathiPolicy,
    "tempo": TempoPolicy,
    "gmax": GmaxPolicy,
    "slos": SlosServePolicy,
}


def make_policy(name: str, **params: Any) -> Policy:
    """Build a policy by name; parameters it does not take are an error, not ignored."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown SLO policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(**params)
