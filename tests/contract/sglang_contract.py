"""Every SGLang internal sglang-slo relies on, and a checker that says which one the installed
SGLang lacks.

Our adapter (scheduler/sglang_*.py, scheduler/components, server/sglang_http.py,
server/cpu_support, launch/) overrides SGLang's methods, reads its request and batch attributes,
its server-args fields, and substitutes its CPU kernels. A release that renames or reshapes one of
these can leave the server starting and serving while our policy quietly stops acting; this
contract fails loudly instead. When you add a use of an SGLang internal, add it here.

Kinds of entries (each names what breaks when it goes):
- `Exists(module, name)`: a module attribute, dotted for class members (`Scheduler.run_batch`).
- `Takes(module, name, params)`: a callable accepting these parameter names.
- `Fields(module, cls, names)`: fields of a record class (ServerArgs).
- `SetsAttrs(module, cls, names)`: attributes a class's instances get (assigned as `self.x` in the
  class body or defined on the class), read without building one.
- `CallArity(module, cls, method, callee, count)`: `method` calls `self.<callee>(...)` with
  `count` positional arguments (the CPU attention ops we substitute take them positionally).
- `Reads(module, name, attr)`: the function `name` reads `attr` (as `x.attr` or `getattr(x, "attr")`):
  the switch we set is still the one SGLang's code consults.
- `ImportsFrom(module, source, names)`: what `module` imports from `source` is among `names` (the
  `sgl_kernel` ops of SGLang's CPU path, `*_cpu`, must be ones our CPU substitute provides).
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Exists:
    module: str
    name: str
    why: str

    def problems(self) -> list[str]:
        found, missing = _resolve(self.module, self.name)
        return [] if missing is None else [f"{self.module}.{self.name}: missing ({missing}); {self.why}"]


@dataclass(frozen=True)
class Takes:
    module: str
    name: str
    params: tuple[str, ...]
    why: str

    def problems(self) -> list[str]:
        found, missing = _resolve(self.module, self.name)
        if missing is not None:
            return [f"{self.module}.{self.name}: missing ({missing}); {self.why}"]
        try:
            names = set(inspect.signature(found).parameters)
        except (TypeError, ValueError) as e:
            return [f"{self.module}.{self.name}: no signature ({e}); {self.why}"]
        lacking = [p for p in self.params if p not in names]
        if lacking:
            return [f"{self.module}.{self.name}: takes no {', '.join(lacking)} (has {sorted(names)}); {self.why}"]
        return []


@dataclass(frozen=True)
class Fields:
    module: str
    cls: str
    names: tuple[str, ...]
    why: str
    absent = "no such field"

    @staticmethod
    def names_of(cls: type) -> set[str]:
        return _record_fields(cls)

    def problems(self) -> list[str]:
        found, missing = _resolve(self.module, self.cls)
        if missing is not None:
            return [f"{self.module}.{self.cls}: missing ({missing}); {self.why}"]
        have = self.names_of(found)
        return [f"{self.module}.{self.cls}.{n}: {self.absent}; {self.why}" for n in self.names if n not in have]


@dataclass(frozen=True)
class SetsAttrs(Fields):
    absent = "never set"

    @staticmethod
    def names_of(cls: type) -> set[str]:
        return _instance_attrs(cls)


@dataclass(frozen=True)
class CallArity:
    module: str
    cls: str
    method: str
    callee: str
    count: int
    why: str

    def problems(self) -> list[str]:
        found, missing = _resolve(self.module, f"{self.cls}.{self.method}")
        if missing is not None:
            return [f"{self.module}.{self.cls}.{self.method}: missing ({missing}); {self.why}"]
        tree = ast.parse(textwrap.dedent(inspect.getsource(found)))
        counts = [
            len(node.args)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == self.callee
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "self"
        ]
        if counts != [self.count]:
            return [
                f"{self.module}.{self.cls}.{self.method}: calls self.{self.callee} with {counts or 'no'} "
                f"positional arguments, we serve {self.count}; {self.why}"
            ]
        return []


@dataclass(frozen=True)
class Reads:
    module: str
    name: str
    attr: str
    why: str

    def problems(self) -> list[str]:
        found, missing = _resolve(self.module, self.name)
        if missing is not None:
            return [f"{self.module}.{self.name}: missing ({missing}); {self.why}"]
        tree = ast.parse(textwrap.dedent(inspect.getsource(found)))
        reads = any(
            (isinstance(node, ast.Attribute) and node.attr == self.attr)
            or (isinstance(node, ast.Constant) and node.value == self.attr)
            for node in ast.walk(tree)
        )
        return [] if reads else [f"{self.module}.{self.name}: no longer reads {self.attr}; {self.why}"]


@dataclass(frozen=True)
class ImportsFrom:
    module: str
    source: str
    names: frozenset[str]
    why: str

    def problems(self) -> list[str]:
        try:
            spec = importlib.util.find_spec(self.module)
        except ModuleNotFoundError as e:
            return [f"{self.module}: missing ({e}); {self.why}"]
        if spec is None or spec.origin is None:
            return [f"{self.module}: missing; {self.why}"]
        with open(spec.origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        imported = {
            alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == self.source
            for alias in node.names
            if self.source != "sgl_kernel" or alias.name.endswith("_cpu")  # the CPU path's ops only
        }
        extra = sorted(imported - self.names)
        return (
            [f"{self.module} imports {', '.join(extra)} from {self.source}, which we do not serve; {self.why}"]
            if extra
            else []
        )


Entry = Exists | Takes | Fields | SetsAttrs | CallArity | Reads | ImportsFrom


def _resolve(module: str, dotted: str) -> tuple[Any, str | None]:
    """(object, None), or (None, what is missing)."""
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        return None, f"cannot import {module}: {e}"
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return None, f"no {part}"
        obj = getattr(obj, part)
    return obj, None


def _record_fields(cls: type) -> set[str]:
    names = set(getattr(cls, "__struct_fields__", ()))  # msgspec records (ServerArgs in 0.5.23)
    names |= set(getattr(cls, "__dataclass_fields__", {}))
    return names or set(vars(cls))


def _instance_attrs(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        names |= set(vars(klass))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            target = node.target if isinstance(node, ast.AnnAssign) else None
            targets = node.targets if isinstance(node, ast.Assign) else [target] if target is not None else []
            for t in targets:
                for leaf in ast.walk(t):
                    if isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name) and leaf.value.id == "self":
                        names.add(leaf.attr)
    return names


def check(entries: Iterable[Entry]) -> list[str]:
    """Every problem the installed SGLang has with these entries (empty: the contract holds)."""
    return [problem for entry in entries for problem in entry.problems()]
