"""A request's SLO: what "fast enough" means for it, parsed and validated in one place.

The HTTP layer turns a bad spec into a 400 naming the field; the policies read the parsed
`SloSpec`. Deadlines are relative to the request's arrival at the server (for compound
requests, to the arrival of the program's first request).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from scheduler.core.field_error import FieldError


class SloClass(str, Enum):
    LATENCY = "latency"  # TTFT + per-token deadline-based TPOT (DSLO)
    DEADLINE = "deadline"  # the whole answer by an end-to-end deadline
    COMPOUND = "compound"  # one stage of a multi-call program with a program deadline
    BEST_EFFORT = "best_effort"  # no target; must not starve


FIELDS = (
    "ttft_ms",
    "tpot_ms",
    "deadline_ms",
    "class",
    "program_id",
    "stage",
    "weight",
    "max_queue_ms",
    "on_infeasible",
)
MAX_ID_LEN = 256
# What happens to a request the policy core predicts will certainly miss its SLO: it runs in the
# best-effort tier (the default), or it is answered at once with HTTP 503 `slo_infeasible`.
BEST_EFFORT_WHEN_INFEASIBLE, REJECT_WHEN_INFEASIBLE = "best_effort", "reject"
ON_INFEASIBLE = (BEST_EFFORT_WHEN_INFEASIBLE, REJECT_WHEN_INFEASIBLE)


class SloValidationError(FieldError):
    """A spec that cannot be served; `field` names the offending field for the 400 body."""


@dataclass(frozen=True)
class SloSpec:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    deadline_ms: float | None = None
    slo_class: SloClass = SloClass.BEST_EFFORT
    program_id: str | None = None
    stage: int | str | None = None
    weight: float = 1.0
    max_queue_ms: float | None = None
    on_infeasible: str = BEST_EFFORT_WHEN_INFEASIBLE
    # Fields the client set explicitly (the rest came from inference or server defaults).
    explicit: frozenset[str] = field(default_factory=frozenset, compare=False)

    @property
    def is_best_effort(self) -> bool:
        return self.slo_class is SloClass.BEST_EFFORT

    @property
    def rejects_when_infeasible(self) -> bool:
        return self.on_infeasible == REJECT_WHEN_INFEASIBLE

    def token_due_s(self, index: int) -> float | None:
        """Seconds after arrival by which output token `index` (0 = first) is due (DSLO)."""
        if self.ttft_ms is None:
            return None
        return (self.ttft_ms + index * (self.tpot_ms or 0.0)) / 1000.0

    def to_dict(self) -> dict[str, Any]:
        """The wire form (custom_params, responses): only set fields, `class` spelled out."""
        out: dict[str, Any] = {"class": self.slo_class.value, "weight": self.weight}
        for name in ("ttft_ms", "tpot_ms", "deadline_ms", "program_id", "stage", "max_queue_ms"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.on_infeasible != BEST_EFFORT_WHEN_INFEASIBLE:
            out["on_infeasible"] = self.on_infeasible
        return out


def _positive_number(spec: Mapping[str, Any], name: str, prefix: str) -> float | None:
    if name not in spec or spec[name] is None:
        return None
    value = spec[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SloValidationError(f"{prefix}{name}", f"must be a number, got {type(value).__name__}")
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int beyond float range
        finite = False
    if not finite or value <= 0:
        raise SloValidationError(f"{prefix}{name}", f"must be a positive finite number, got {value}")
    return float(value)


def _infer_class(spec: Mapping[str, Any]) -> SloClass:
    if spec.get("program_id") is not None:
        return SloClass.COMPOUND
    if spec.get("deadline_ms") is not None:
        return SloClass.DEADLINE
    if spec.get("ttft_ms") is not None or spec.get("tpot_ms") is not None:
        return SloClass.LATENCY
    return SloClass.BEST_EFFORT


def parse_slo(spec: Any, prefix: str = "slo.") -> SloSpec:
    """Validate a client-supplied SLO object; raises SloValidationError naming the field. Runs
    once per request at each trust boundary (an HTTP edge, a worker's link to its router)."""
    if not isinstance(spec, Mapping):
        raise SloValidationError(prefix.rstrip("."), f"must be an object, got {type(spec).__name__}")
    unknown = sorted(set(spec) - set(FIELDS))
    if unknown:
        raise SloValidationError(f"{prefix}{unknown[0]}", f"unknown field (allowed: {', '.join(FIELDS)})")

    ttft = _positive_number(spec, "ttft_ms", prefix)
    tpot = _positive_number(spec, "tpot_ms", prefix)
    deadline = _positive_number(spec, "deadline_ms", prefix)
    for checked_only in ("max_queue_ms", "weight"):  # decode_slo reads them
        _positive_number(spec, checked_only, prefix)

    raw_class = spec.get("class")
    if raw_class is None:
        slo_class = _infer_class(spec)
    else:
        try:
            slo_class = SloClass(raw_class)
        except ValueError:
            allowed = ", ".join(c.value for c in SloClass)
            raise SloValidationError(f"{prefix}class", f"must be one of {allowed}, got {raw_class!r}") from None

    program_id = spec.get("program_id")
    if program_id is not None and (not isinstance(program_id, str) or not program_id or len(program_id) > MAX_ID_LEN):
        raise SloValidationError(f"{prefix}program_id", f"must be a non-empty string of at most {MAX_ID_LEN} chars")
    stage = spec.get("stage")
    if stage is not None:
        if isinstance(stage, bool) or not isinstance(stage, (int, str)):
            raise SloValidationError(f"{prefix}stage", "must be a non-negative integer or a stage name")
        if isinstance(stage, int) and stage < 0:
            raise SloValidationError(f"{prefix}stage", f"must be non-negative, got {stage}")
        if isinstance(stage, str) and not (0 < len(stage) <= MAX_ID_LEN):
            raise SloValidationError(f"{prefix}stage", f"must be 1..{MAX_ID_LEN} chars")
        if program_id is None:
            raise SloValidationError(f"{prefix}stage", "needs program_id: a stage belongs to a program")

    on_infeasible = spec.get("on_infeasible")
    if on_infeasible is not None and on_infeasible not in ON_INFEASIBLE:
        raise SloValidationError(
            f"{prefix}on_infeasible", f"must be one of {', '.join(ON_INFEASIBLE)}, got {on_infeasible!r}"
        )

    _check_combination(slo_class, ttft, tpot, deadline, program_id, prefix)
    return decode_slo(spec)


def _number(wire: Mapping[str, Any], name: str) -> float | None:
    value = wire.get(name)
    return None if value is None else float(value)


def decode_slo(wire: Mapping[str, Any]) -> SloSpec:
    """The SloSpec of a form `parse_slo` already accepted, without checking it again: for the
    hops behind the edge that validated it (the scheduler reading what its HTTP process
    injected), so a request is validated once per trust boundary, not once per process hop."""
    raw_class = wire.get("class")
    on_infeasible = wire.get("on_infeasible")
    weight = _number(wire, "weight")
    return SloSpec(
        ttft_ms=_number(wire, "ttft_ms"),
        tpot_ms=_number(wire, "tpot_ms"),
        deadline_ms=_number(wire, "deadline_ms"),
        slo_class=_infer_class(wire) if raw_class is None else SloClass(raw_class),
        program_id=wire.get("program_id"),
        stage=wire.get("stage"),
        weight=1.0 if weight is None else weight,
        max_queue_ms=_number(wire, "max_queue_ms"),
        on_infeasible=BEST_EFFORT_WHEN_INFEASIBLE if on_infeasible is None else on_infeasible,
        explicit=frozenset(k for k, v in wire.items() if v is not None),
    )


def _check_combination(
    slo_class: SloClass,
    ttft: float | None,
    tpot: float | None,
    deadline: float | None,
    program_id: str | None,
    prefix: str,
) -> None:
    """Reject specs no schedule could satisfy or that contradict their class."""
    if slo_class is SloClass.LATENCY and ttft is None and tpot is None:
        raise SloValidationError(f"{prefix}ttft_ms", "class latency needs ttft_ms and/or tpot_ms")
    if slo_class is SloClass.DEADLINE and deadline is None:
        raise SloValidationError(f"{prefix}deadline_ms", "class deadline needs deadline_ms")
    if slo_class is SloClass.COMPOUND:
        if program_id is None:
            raise SloValidationError(f"{prefix}program_id", "class compound needs program_id")
        if deadline is None:
            raise SloValidationError(f"{prefix}deadline_ms", "class compound needs the program's deadline_ms")
    if slo_class is SloClass.BEST_EFFORT:
        for name, value in (("ttft_ms", ttft), ("tpot_ms", tpot), ("deadline_ms", deadline)):
            if value is not None:
                raise SloValidationError(f"{prefix}{name}", "class best_effort carries no latency target")
    if tpot is not None and ttft is None:
        raise SloValidationError(
            f"{prefix}ttft_ms", "tpot_ms is deadline-based (token i due at ttft + i*tpot): set ttft_ms too"
        )
    if deadline is not None and ttft is not None and deadline < ttft:
        raise SloValidationError(
            f"{prefix}deadline_ms", f"deadline {deadline} ms is before the first-token target {ttft} ms"
        )


def merge_defaults(spec: SloSpec | None, defaults: SloSpec | None) -> SloSpec:
    """A request without any SLO gets the server's default (best-effort when there is none)."""
    if spec is not None:
        return spec
    return defaults if defaults is not None else SloSpec()
