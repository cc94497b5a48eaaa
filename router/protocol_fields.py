"""Checks of one wire field each, the pieces router/protocol.py's message tables are made of.

A check takes the field's value and name and returns the value in its normal form (a list of
token ids becomes a tuple, an integer rate a float), or raises a `ProtocolError` naming the field.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

MAX_ID_LEN = 256
MAX_TOKEN_ID = 2**31 - 1
_HEX_RE = re.compile(r"[0-9a-f]{32,128}")
# Worker ids double as ZMQ routing ids (must not start with a zero byte) and metric labels.
_WORKER_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")

Check = Callable[[Any, str], Any]  # the field's value and name -> the normalised value, or ProtocolError(name)


class ProtocolError(ValueError):
    """A malformed message; `field` names what was wrong ("frame" for the frame as a whole)."""

    def __init__(self, field_name: str, reason: str) -> None:
        super().__init__(f"{field_name}: {reason}")
        self.field = field_name
        self.reason = reason


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def ident(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(name, f"must be a string, got {type_name(value)}")
    if not 0 < len(value) <= MAX_ID_LEN:
        raise ProtocolError(name, f"must be 1..{MAX_ID_LEN} chars")
    return value


def check_worker_id(value: Any, name: str = "worker_id") -> str:
    """Worker ids double as ZMQ routing ids and metric labels, hence the narrow alphabet."""
    ident(value, name)
    if not _WORKER_ID_RE.fullmatch(value):
        raise ProtocolError(name, "must be 1..128 chars of [A-Za-z0-9._:@-], starting alphanumeric")
    return value


def opt_str(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ProtocolError(name, f"must be a string or null, got {type_name(value)}")
    return value


def string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ProtocolError(name, f"must be a string, got {type_name(value)}")
    return value


def count(value: Any, name: str, minimum: int = 0) -> int:
    if type(value) is not int:  # excludes bool, and floats from ints beyond 64 bits
        raise ProtocolError(name, f"must be an integer, got {type_name(value)}")
    if value < minimum:
        raise ProtocolError(name, f"must be >= {minimum}, got {value}")
    return value


def rate(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ProtocolError(name, f"must be a number, got {type_name(value)}")
    try:
        finite = math.isfinite(value)
    except OverflowError:
        finite = False
    if not finite or value < 0:
        raise ProtocolError(name, f"must be a non-negative finite number, got {value}")
    return float(value)


def boolean(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(name, f"must be a boolean, got {type_name(value)}")
    return value


def hex_digits(value: Any, name: str) -> str:
    """Nonces and MACs: lowercase hex, 32..128 digits."""
    if not isinstance(value, str) or not _HEX_RE.fullmatch(value):
        raise ProtocolError(name, "must be 32..128 lowercase hex digits")
    return value


def obj(value: Any, name: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ProtocolError(name, f"must be an object, got {type_name(value)}")
    return value


def token_ids(value: Any, name: str, non_empty: bool = False) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise ProtocolError(name, f"must be a list of token ids, got {type_name(value)}")
    if non_empty and not value:
        raise ProtocolError(name, "must not be empty")
    if not value or (set(map(type, value)) == {int} and min(value) >= 0 and max(value) <= MAX_TOKEN_ID):
        return tuple(value)  # fast path: C-speed checks over long prompts
    for i, tok in enumerate(value):
        if type(tok) is not int or not 0 <= tok <= MAX_TOKEN_ID:
            raise ProtocolError(f"{name}[{i}]", f"must be a token id in 0..{MAX_TOKEN_ID}, got {tok!r}")
    return tuple(value)


def non_empty_tokens(value: Any, name: str) -> tuple[int, ...]:
    return token_ids(value, name, non_empty=True)


# --- builders of checks with a parameter ---


def optional(check: Check) -> Check:
    """`check`, or None left as it is."""
    return lambda value, name: None if value is None else check(value, name)


def at_least(minimum: int) -> Check:
    return lambda value, name: count(value, name, minimum)


def int_in(low: int, high: int, what: str) -> Check:
    """An integer in [low, high), else "must be <what>"."""

    def check(value: Any, name: str) -> int:
        if not low <= count(value, name) < high:
            raise ProtocolError(name, f"must be {what}, got {value}")
        return int(value)

    return check


def rate_at_least(minimum: float) -> Check:
    def check(value: Any, name: str) -> float:
        if rate(value, name) < minimum:
            raise ProtocolError(name, f"must be >= {minimum:g}, got {value}")
        return float(value)

    return check


def one_of(choices: tuple[str, ...], what: str, show_value: bool = True) -> Check:
    def check(value: Any, name: str) -> Any:
        if value not in choices:
            raise ProtocolError(name, f"must be {what}, got {value!r}" if show_value else f"must be {what}")
        return value

    return check
