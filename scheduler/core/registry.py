"""One registry shape for every pluggable family: SLO policies, routing policies, length predictors.

An entry is a name, a frozen parameters dataclass and a factory `(params, context) -> object`. The
parameters dataclass is the single place a parameter is declared: its defaults are the parameter's defaults
and its `__post_init__` checks ranges, so a direct construction and a name-plus-JSON construction
fail alike. The context is a small dataclass per family carrying what the host provides (the
engine's perf model, the router's in-flight view and clock), so a factory never guesses its
dependencies from a signature.

Values coming from JSON (command-line flags, YAML) are checked against the field annotations
before the dataclass sees them: an int may stand for a float, a list for a tuple, an object for a
nested parameters dataclass; anything else is refused with the field named. Every refusal is a
`ParamError`, a ValueError whose `field` names the offending parameter (None: the name itself).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")
C = TypeVar("C")


class ParamError(ValueError):
    """A name or parameter value a registry or a parameters dataclass refuses."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def require(ok: bool, field: str, rule: str, value: Any) -> None:
    """The check a parameters dataclass runs per field: `require(k >= 1, "k", "must be >= 1", k)`."""
    if not ok:
        raise ParamError(f"{field} {rule}, got {value!r}", field)


@dataclass(frozen=True)
class NoParams:
    """Parameters of an entry that takes none."""


@dataclass(frozen=True)
class Entry(Generic[C, T]):
    """One registered name: how to read its parameters and how to build it."""

    name: str
    params_type: type
    factory: Callable[[Any, C], T]


class Registry(Generic[C, T]):
    """Named entries of one family. Iterating, `in` and `len` see the names in registration order."""

    def __init__(self, family: str, entries: Sequence[Entry[C, T]] = ()) -> None:
        self.family = family  # how messages call an entry: "SLO policy", "routing policy", ...
        self._entries: dict[str, Entry[C, T]] = {}
        for entry in entries:
            self.add(entry)

    def add(self, entry: Entry[C, T]) -> None:
        if entry.name in self._entries:
            raise ValueError(f"{self.family} {entry.name!r} is registered twice")
        if not dataclasses.is_dataclass(entry.params_type):
            raise TypeError(f"{self.family} {entry.name!r}: parameters must be a dataclass")
        self._entries[entry.name] = entry

    def register(self, name: str, params_type: type, factory: Callable[[Any, C], T]) -> None:
        self.add(Entry(name, params_type, factory))

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def names(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> Entry[C, T]:
        try:
            return self._entries[name]
        except KeyError:
            known = ", ".join(sorted(self._entries))
            raise ParamError(f"unknown {self.family} {name!r}; known: {known}") from None

    def param_names(self, name: str) -> tuple[str, ...]:
        """The parameters `name` accepts, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(self.entry(name).params_type))

    def defaults(self, name: str) -> dict[str, Any]:
        """Default value of each of `name`'s parameters."""
        return dataclasses.asdict(self.entry(name).params_type())

    def params(self, name: str, values: Mapping[str, Any] | None = None) -> Any:
        """`name`'s parameters dataclass built from plain values, every refusal naming its field."""
        entry = self.entry(name)
        try:
            return build_params(entry.params_type, values or {})
        except ParamError as e:
            raise ParamError(f"{self.family} {name!r}: {e}", e.field) from None

    def make(self, name: str, values: Mapping[str, Any] | None, context: C) -> T:
        """Build `name` from plain parameter values (validated first) and the host's context."""
        return self.entry(name).factory(self.params(name, values), context)


def build_params(params_type: type, values: Mapping[str, Any], prefix: str = "") -> Any:
    """An instance of the parameters dataclass `params_type` from plain (JSON-like) values."""
    fields = {f.name: f for f in dataclasses.fields(params_type)}
    unknown = [k for k in values if k not in fields]
    if unknown:
        accepted = ", ".join(fields) or "none"
        raise ParamError(f"takes no parameter {prefix + unknown[0]!r} (accepted: {accepted})", prefix + unknown[0])
    hints = typing.get_type_hints(params_type)
    kwargs = {}
    for k, v in values.items():
        default = fields[k].default
        if isinstance(v, Mapping) and dataclasses.is_dataclass(default) and not isinstance(default, type):
            # a nested object starts from the field's default: it names only what it changes
            v = {**{f.name: getattr(default, f.name) for f in dataclasses.fields(default)}, **v}
        kwargs[k] = _coerce(v, hints[k], prefix + k)
    try:
        return params_type(**kwargs)
    except TypeError as e:  # a nested object without a field that has no default
        raise ParamError(f"{prefix.rstrip('.') or params_type.__name__}: {e}", prefix.rstrip(".") or None) from None
    except ParamError as e:
        if prefix and e.field is not None:
            raise ParamError(f"{prefix}{e}", prefix + e.field) from None
        raise


def _coerce(value: Any, hint: Any, field: str) -> Any:
    """`value` as the annotation `hint` wants it, or a ParamError naming `field`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, field)
            except ParamError as e:
                if e.field != field:  # refused deeper down (a nested field, a list item): say where
                    raise
    elif origin is typing.Literal:
        if value in args:
            return value
    elif hint is float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif origin in (tuple, Sequence) and isinstance(value, list | tuple):
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(args) == len(value):
                return tuple(_coerce(v, a, f"{field}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        else:
            item = args[0] if args else Any
            return tuple(_coerce(v, item, f"{field}[{i}]") for i, v in enumerate(value))
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint) and isinstance(value, Mapping):
        return build_params(hint, value, prefix=field + ".")
    elif isinstance(hint, type) and isinstance(value, hint):
        return value
    raise ParamError(f"{field} must be {_type_name(hint)}, got {value!r}", field)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(hint))
    if typing.get_origin(hint) in (tuple, Sequence):
        return "a list"
    if dataclasses.is_dataclass(hint):
        return f"an object with fields {', '.join(f.name for f in dataclasses.fields(hint))}"
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))
