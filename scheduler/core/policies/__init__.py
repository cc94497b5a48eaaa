"""Policy registry: adding a policy is one module plus one line in POLICIES."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from scheduler.core.policies.edf import EdfPolicy
from scheduler.core.policies.fcfs import FcfsPolicy
from scheduler.core.policies.gmax import GmaxPolicy
from scheduler.core.policies.las import LasPolicy
from scheduler.core.policies.oracle import oracle_of
from scheduler.core.policies.sarathi import SarathiPolicy
from scheduler.core.policies.sjf import SjfPolicy
from scheduler.core.policies.slos import SlosServePolicy
from scheduler.core.policies.tempo import TempoPolicy
from scheduler.core.types import PerfModel, Policy

POLICIES: dict[str, Callable[..., Policy]] = {
    "fcfs": FcfsPolicy,
    "edf": EdfPolicy,
    "sjf": SjfPolicy,
    "las": LasPolicy,
    "sarathi": SarathiPolicy,
    "tempo": TempoPolicy,
    "gmax": GmaxPolicy,
    "slos": SlosServePolicy,
    # Benchmarks only: plan with the true output length (see oracle.py).
    "tempo_oracle": oracle_of(TempoPolicy, "tempo"),
    "gmax_oracle": oracle_of(GmaxPolicy, "gmax"),
}


def accepted_params(name: str) -> set[str]:
    """Constructor parameters of a policy (what --slo-policy-param and the flags may set)."""
    return set(inspect.signature(POLICIES[name]).parameters) - {"self"}


def make_policy(name: str, perf_model: PerfModel | None = None, **params: Any) -> Policy:
    """Build a policy by name; parameters it does not take are an error, not ignored. The
    engine's performance model goes to the policies that predict time with one."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown SLO policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    if perf_model is not None and "perf_model" in accepted_params(name):
        params = {**params, "perf_model": perf_model}
    return factory(**params)
