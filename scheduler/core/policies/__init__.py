"""Policy registry: adding a policy is one module (its class and parameters dataclass) plus one
line in POLICIES."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scheduler.core.policies.edf import EdfParams, EdfPolicy
from scheduler.core.policies.fcfs import FcfsPolicy
from scheduler.core.policies.gmax import GmaxParams, GmaxPolicy
from scheduler.core.policies.las import LasParams, LasPolicy
from scheduler.core.policies.oracle import oracle_of
from scheduler.core.policies.sarathi import SarathiParams, SarathiPolicy
from scheduler.core.policies.sjf import SjfParams, SjfPolicy
from scheduler.core.policies.slos import SlosServeParams, SlosServePolicy
from scheduler.core.policies.tempo import TempoParams, TempoPolicy
from scheduler.core.registry import Entry, NoParams, Registry
from scheduler.core.types import PerfModel, Policy


@dataclass(frozen=True)
class PolicyContext:
    """What the engine hands a policy: its step-time model (None: the policy's own default)."""

    perf_model: PerfModel | None = None


TEMPO: Entry[PolicyContext, Policy] = Entry("tempo", TempoParams, lambda p, ctx: TempoPolicy(p, ctx.perf_model))
GMAX: Entry[PolicyContext, Policy] = Entry("gmax", GmaxParams, lambda p, ctx: GmaxPolicy(p, ctx.perf_model))

POLICIES: Registry[PolicyContext, Policy] = Registry(
    "SLO policy",
    [
        Entry("fcfs", NoParams, lambda p, ctx: FcfsPolicy()),
        Entry("edf", EdfParams, lambda p, ctx: EdfPolicy(p)),
        Entry("sjf", SjfParams, lambda p, ctx: SjfPolicy(p)),
        Entry("las", LasParams, lambda p, ctx: LasPolicy(p)),
        Entry("sarathi", SarathiParams, lambda p, ctx: SarathiPolicy(p)),
        TEMPO,
        GMAX,
        Entry("slos", SlosServeParams, lambda p, ctx: SlosServePolicy(p, ctx.perf_model)),
        # Benchmarks only: plan with the true output length (see oracle.py).
        oracle_of(TEMPO),
        oracle_of(GMAX),
    ],
)


def accepted_params(name: str) -> tuple[str, ...]:
    """What --slo-policy-param and the policy flags may set for `name`."""
    return POLICIES.param_names(name)


def make_policy(name: str, perf_model: PerfModel | None = None, **params: Any) -> Policy:
    """Build a policy by name from plain parameter values (checked: a parameter it does not take,
    a wrong type or an out-of-range value is a ParamError naming the field)."""
    return POLICIES.make(name, params, PolicyContext(perf_model))
