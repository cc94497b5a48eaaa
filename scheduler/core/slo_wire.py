"""The SLO's wire form: where a request's SLO is read from and how it travels into the scheduler.

Sources, highest precedence first: the body's top-level `slo` object (native and OpenAI
routes), `sampling_params.custom_params.slo` (what SGLang frontend programs can send), and the
`x-slo-*` headers filling fields the body left out. A request with none gets the server's
default. The validated SLO and the arrival time go into SGLang's `custom_params`, which reaches
the scheduler's Req unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from scheduler.core.slo import SloSpec, SloValidationError, decode_slo, merge_defaults, parse_slo
from wire import ARRIVAL_PARAM, SLO_HEADER_FIELDS, SLO_PARAM


def _header_fields(headers: Mapping[str, str]) -> dict[str, float]:
    found: dict[str, float] = {}
    for header, name in SLO_HEADER_FIELDS.items():
        raw = headers.get(header)
        if raw is None:
            continue
        try:
            value = float(raw)
        except ValueError:
            raise SloValidationError(header, f"must be a number of milliseconds, got {raw!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise SloValidationError(header, f"must be a positive number of milliseconds, got {raw!r}")
        found[name] = value
    return found


def _sampling_params_list(body: dict[str, Any]) -> list[dict[str, Any]]:
    params = body.get("sampling_params")
    if params is None:
        params = body["sampling_params"] = {}
    if isinstance(params, dict):
        return [params]
    if isinstance(params, list) and all(isinstance(p, dict) for p in params):
        return params
    raise SloValidationError("sampling_params", "must be an object or a list of objects")


def _custom_params_slo(body: dict[str, Any]) -> Any:
    params = body.get("sampling_params")
    candidates = params if isinstance(params, list) else [params]
    for p in candidates:
        if isinstance(p, dict) and isinstance(p.get("custom_params"), dict) and SLO_PARAM in p["custom_params"]:
            return p["custom_params"][SLO_PARAM]
    return None


def extract_slo(
    body: dict[str, Any], headers: Mapping[str, str], defaults: SloSpec | None, native: bool, validated: bool = False
) -> SloSpec:
    """The request's validated SLO; raises SloValidationError naming the bad field. `validated`:
    the body's top-level `slo` was checked on its way into this process (a worker's agent
    decoding the router's Submit), so it is decoded, not checked again."""
    raw = body.pop(SLO_PARAM, None)
    if validated and isinstance(raw, dict):
        return decode_slo(raw)
    prefix = "slo."
    if raw is None and native:
        raw = _custom_params_slo(body)
        prefix = "sampling_params.custom_params.slo."
    if raw is not None and not isinstance(raw, dict):
        raise SloValidationError(prefix.rstrip("."), f"must be an object, got {type(raw).__name__}")
    from_headers = _header_fields(headers)
    if raw is None and not from_headers:  # the server's default: nothing in it is the client's ask
        spec = merge_defaults(None, defaults)
        return dataclasses.replace(spec, explicit=frozenset()) if spec.explicit else spec
    merged = {**from_headers, **{k: v for k, v in (raw or {}).items() if v is not None}}
    return parse_slo(merged, prefix=prefix)


def _set_custom(params: dict[str, Any], field: str, spec: SloSpec, arrival: float) -> None:
    custom = params.get("custom_params")
    if custom is None:
        custom = params["custom_params"] = {}
    if not isinstance(custom, dict):
        raise SloValidationError(field, "must be an object")
    custom[SLO_PARAM] = spec.to_dict()
    custom[ARRIVAL_PARAM] = arrival


def inject_native(body: dict[str, Any], spec: SloSpec, arrival: float) -> None:
    for params in _sampling_params_list(body):
        _set_custom(params, "sampling_params.custom_params", spec, arrival)


def inject_openai(body: dict[str, Any], spec: SloSpec, arrival: float) -> None:
    _set_custom(body, "custom_params", spec, arrival)


def read_injected(custom_params: Mapping[str, Any] | None, validated: bool = False) -> tuple[SloSpec, float] | None:
    """The SLO and arrival a request carries after injection (None if it has none). `validated`:
    the HTTP edge in front of this reader already checked it (the scheduler behind its own
    HTTP process), so it is decoded, not checked again."""
    if not custom_params or SLO_PARAM not in custom_params:
        return None
    arrival = custom_params.get(ARRIVAL_PARAM)
    if not isinstance(arrival, (int, float)):
        return None
    raw = custom_params[SLO_PARAM]
    return (decode_slo(raw) if validated else parse_slo(raw)), float(arrival)
