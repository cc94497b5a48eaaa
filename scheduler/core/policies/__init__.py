"""Policy registry: adding a policy is one module (its class and parameters dataclass) plus one
line in POLICIES."""

from __future__ import annotations

from collections.abc import Mapping
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
SLOS: Entry[PolicyContext, Policy] = Entry("slos", SlosServeParams, lambda p, ctx: SlosServePolicy(p, ctx.perf_model))

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
        SLOS,
        # Benchmarks only: plan with the true output length (see oracle.py).
        oracle_of(TEMPO),
        oracle_of(GMAX),
        oracle_of(SLOS),
    ],
)


def accepted_params(name: str) -> tuple[str, ...]:
    """What --slo-policy-param and the policy flags may set for `name`."""
    return POLICIES.param_names(name)


def dilated_params(name: str, params: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """`params` with every parameter in seconds (a number named `*_s`, given or default) `factor`
    times longer. On an emulated card in dilated time (steps and SLOs `factor` times longer) a
    policy's own time constants are card seconds too; left as they are they shrink against
    every step, and the emulated server's policy is not the one the simulator runs (SLOs-Serve's
    50 ms idle batch was 10 card-ms at x5)."""
    out = dict(params)
    if factor == 1.0:
        return out
    for key, default in POLICIES.defaults(name).items():
        value = out.get(key, default)
        if key.endswith("_s") and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value) * factor
    return out


def make_policy(name: str, perf_model: PerfModel | None = None, **params: Any) -> Policy:
    """Build a policy by name from plain parameter values (checked: a parameter it does not take,
    a wrong type or an out-of-range value is a ParamError naming the field)."""
    return POLICIES.make(name, params, PolicyContext(perf_model))
