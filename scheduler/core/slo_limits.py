"""What one API key may ask of the scheduler: the classes it may use, the tightest targets and
the largest weight. An SLO is a priority, so on a shared server it is also a tenant's claim on
everyone else's capacity; these limits keep that claim within what the operator granted.

`apply_limits` is the one place a spec is held to a key's limits; both HTTP edges (the router
and a worker's SLO middleware) call it with the caller's limits, and `namespaced` keeps one
tenant's program ids apart from another's. Rules:

- a target tighter than the key's minimum (`ttft_ms`, `tpot_ms`, `deadline_ms`) is raised to
  it, a weight above the maximum lowered to it (`clamp`), or refused with 403 naming the field
  (`reject`);
- a class the key may not use cannot be moved to a nearby class: it is refused with 403 naming
  `slo.class`, except under `clamp` when the key may use `best_effort`, which asks nothing of
  anyone else: the request is then served best effort (its targets dropped);
- what the client did not set itself (the server's default SLO) is always clamped, never
  refused: the client asked for nothing beyond its limits.
Every change is reported as `{field: {"asked": ..., "granted": ...}}`, which the response's SLO
report carries as `clamped`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
from typing import Any

from scheduler.core.field_error import FieldError
from scheduler.core.slo import MAX_ID_LEN, SloClass, SloSpec
from wire import SHARE_PARAM, TENANT_PARAM

CLAMP = "clamp"  # an SLO beyond the limits is moved to the limit and the response says so
REJECT = "reject"  # an SLO beyond the limits is refused with HTTP 403 naming the field
ON_VIOLATION = (CLAMP, REJECT)
_TARGETS = (("ttft_ms", "min_ttft_ms"), ("tpot_ms", "min_tpot_ms"), ("deadline_ms", "min_deadline_ms"))


@dataclass(frozen=True)
class SloLimits:
    """Per-key bounds on a client's SLO (None: no bound)."""

    classes: frozenset[SloClass] | None = None  # the classes the key may use (None: any)
    min_ttft_ms: float | None = None  # the tightest first-token target it may ask for
    min_tpot_ms: float | None = None  # the tightest per-token target
    min_deadline_ms: float | None = None  # the tightest end-to-end deadline
    max_weight: float | None = None  # the largest service-gain weight
    on_violation: str = CLAMP


class SloLimitError(FieldError):
    """An SLO the key may not ask for (HTTP 403); `field` names it, as `slo.<name>`."""


Clamped = dict[str, dict[str, Any]]


def apply_limits(spec: SloSpec, limits: SloLimits, prefix: str = "slo.") -> tuple[SloSpec, Clamped]:
    """`spec` within `limits` and what was changed; SloLimitError when it must be refused."""
    clamped: Clamped = {}
    reject = limits.on_violation == REJECT
    if limits.classes is not None and spec.slo_class not in limits.classes:
        asked = spec.slo_class.value
        allowed = ", ".join(sorted(c.value for c in limits.classes))
        downgrade = SloClass.BEST_EFFORT in limits.classes and (not reject or not spec.explicit)
        if not downgrade:
            raise SloLimitError(f"{prefix}class", f"{asked!r} is not allowed for this key (allowed: {allowed})")
        spec = replace(spec, slo_class=SloClass.BEST_EFFORT, ttft_ms=None, tpot_ms=None, deadline_ms=None)
        clamped["class"] = {"asked": asked, "granted": SloClass.BEST_EFFORT.value}
    changes: dict[str, Any] = {}
    for name, bound_name in _TARGETS:
        asked_ms, bound = getattr(spec, name), getattr(limits, bound_name)
        if asked_ms is not None and bound is not None and asked_ms < bound:
            if reject and name in spec.explicit:
                raise SloLimitError(
                    f"{prefix}{name}", f"{asked_ms:g} ms is tighter than this key's minimum {bound:g} ms"
                )
            changes[name] = bound
    if limits.max_weight is not None and spec.weight > limits.max_weight:
        if reject and "weight" in spec.explicit:
            raise SloLimitError(f"{prefix}weight", f"{spec.weight:g} is above this key's maximum {limits.max_weight:g}")
        changes["weight"] = limits.max_weight
    ttft, deadline = changes.get("ttft_ms", spec.ttft_ms), changes.get("deadline_ms", spec.deadline_ms)
    if ttft is not None and deadline is not None and deadline < ttft:
        changes["deadline_ms"] = ttft  # a raised first-token target moves the deadline with it
    for name, granted in changes.items():
        clamped[name] = {"asked": getattr(spec, name), "granted": granted}
    return (replace(spec, **changes) if changes else spec), clamped


def namespaced(spec: SloSpec, tenant: str) -> SloSpec:
    """`spec` with its program id in `tenant`'s namespace: one tenant's calls cannot move
    another's program start (the deadline's base) or teach its learned lengths. The id stays
    readable (`tenant/id`) when it fits the id limit, else the client's part is hashed."""
    if spec.program_id is None:
        return spec
    pid = f"{tenant}/{spec.program_id}"
    if len(pid) > MAX_ID_LEN:
        pid = f"{tenant}/#{hashlib.sha256(spec.program_id.encode()).hexdigest()}"
    return replace(spec, program_id=pid)


def hold_to_key(
    spec: SloSpec, tenant: str, limits: SloLimits | None, share: float, custom: dict[str, Any], prefix: str = "slo."
) -> tuple[SloSpec, Clamped]:
    """What an HTTP edge does with an authenticated caller's request: the SLO within the key's
    limits, its program id in the key's namespace, and the key's name and share written into
    the request's `custom_params` (after the client's own `slo_*` keys were stripped), where
    the scheduler's fair shares read them. SloLimitError when the SLO must be refused."""
    clamped: Clamped = {}
    if limits is not None:
        spec, clamped = apply_limits(spec, limits, prefix)
    custom[TENANT_PARAM] = tenant
    custom[SHARE_PARAM] = share
    return namespaced(spec, tenant), clamped
