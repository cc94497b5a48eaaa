"""No private name crosses a package boundary: `from pkg.mod import _name` is only allowed
inside the package that owns `_name` (the layer contracts themselves run as `lint-imports` in
./slo test, from pyproject.toml)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("server", "router", "scheduler", "wire", "benchmarks", "launch")
OURS = ("server", "router", "scheduler", "wire", "benchmarks")


def _owner(module: str) -> str:
    """The package a module belongs to for this rule: scheduler.core is its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[:2] == ["scheduler", "core"] else parts[0]


def _private_imports(path: Path) -> list[str]:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] not in OURS or _owner(node.module) == _owner(module):
                continue
            private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
            if private or any(part.startswith("_") and not part.startswith("__") for part in node.module.split(".")):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import {', '.join(private)}")
    return found


def test_no_private_name_is_imported_across_packages() -> None:
    offenders = [
        hit for pkg in PACKAGES for path in sorted((ROOT / pkg).rglob("*.py")) for hit in _private_imports(path)
    ]
    assert not offenders, "\n".join(offenders)
