"""The parameter tables of docs/policies.md, generated from the two policy registries.

A parameter's default is its parameters dataclass's default and its meaning is the comment
written next to the field, so the page cannot drift from the code: the doc-check regenerates
the tables and fails when the page differs. Rewrite the page after changing a policy with
`.venv/bin/python -m tests.unit.docs.policy_tables`.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from router.policies import ROUTING_POLICIES
from scheduler.core.policies import POLICIES
from scheduler.core.registry import Registry

PAGE = Path(__file__).resolve().parents[3] / "docs" / "policies.md"
BEGIN = "<!-- BEGIN GENERATED: tests/unit/docs/policy_tables.py -->"
END = "<!-- END GENERATED -->"
_FIELD = re.compile(r"^\s+(\w+)\s*:\s*[^=#]+(?:=[^#]*)?(?:#\s*(.*))?$")
_LONG_DEFAULT = 48


def field_comments(params_type: type) -> dict[str, str]:
    """Each field's comment: the one on its line, else the comment lines right above it."""
    comments: dict[str, str] = {}
    for klass in reversed(params_type.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        above: list[str] = []
        for line in inspect.getsource(klass).splitlines():
            stripped = line.strip()
            if stripped.startswith("#"):
                above.append(stripped.lstrip("#").strip())
                continue
            match = _FIELD.match(line)
            if match and not stripped.startswith(("def ", "class ", "@")):
                comments[match.group(1)] = (match.group(2) or " ".join(above)).strip()
            above = []
    return comments


def _default(field: dataclasses.Field[Any]) -> str:
    if field.default is not dataclasses.MISSING:
        value: Any = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    text = repr(value)
    if len(text) > _LONG_DEFAULT:
        return f"a `{type(value).__name__}`"
    return f"`{text}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def registry_tables(registry: Registry[Any, Any], flag: str) -> str:
    """One table per parameters type of `registry`; entries without parameters share one line."""
    out: list[str] = []
    bare: list[str] = []
    first_of: dict[type, str] = {}
    for name in registry:
        params_type = registry.entry(name).params_type
        fields = dataclasses.fields(params_type)
        if not fields:
            bare.append(f"`{name}`")
            continue
        if params_type in first_of:
            out.append(f"#### `{name}`\n\nThe parameters of `{first_of[params_type]}`.\n")
            continue
        first_of[params_type] = name
        comments = field_comments(params_type)
        out.append(f"#### `{name}` (`{params_type.__module__}.{params_type.__qualname__}`)\n")
        out.append(f"| `{flag} KEY=VALUE` | default | what it sets |")
        out.append("|---|---|---|")
        for field in fields:
            out.append(f"| `{field.name}` | {_cell(_default(field))} | {_cell(comments.get(field.name, ''))} |")
        out.append("")
    if bare:
        out.append(f"Without parameters: {', '.join(bare)}.\n")
    return "\n".join(out)


def generated_block() -> str:
    return "\n".join(
        [
            BEGIN,
            "",
            "### Engine policies (`--slo-policy`)",
            "",
            registry_tables(POLICIES, "--slo-policy-param"),
            "### Routing policies (`--routing-policy`)",
            "",
            registry_tables(ROUTING_POLICIES, "--routing-policy-param"),
            END,
        ]
    )


def render(page: str) -> str:
    """`page` with its generated block replaced by the registries' current tables."""
    start, stop = page.index(BEGIN), page.index(END) + len(END)
    return page[:start] + generated_block() + page[stop:]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Rewrite docs/policies.md's parameter tables from the registries.")
    parser.add_argument("--check", action="store_true", help="only say whether the page is current (exit 1 if not)")
    args = parser.parse_args(argv)
    page = PAGE.read_text()
    if args.check:
        sys.exit(0 if render(page) == page else 1)
    PAGE.write_text(render(page))
    sys.stdout.write(f"wrote {PAGE}\n")


if __name__ == "__main__":
    main()
