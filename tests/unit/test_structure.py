"""The house rules a reader relies on to find their way: rooms that fit in a head (no module
over MAX_MODULE_LINES lines, no class over MAX_CLASS_LINES, in the product packages) and layers
without circles (no import cycle among our modules, at any depth, not only between packages).

Imports under `if TYPE_CHECKING:` and imports inside functions count as edges like any other:
a cycle hidden behind either is still two modules that cannot be understood apart, and a
function-local import put there to dodge a circle is the circle itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("server", "router", "scheduler", "launch", "wire")
# The benchmarks are no product by the size rules (experiment scripts), but a circle there is as
# hard to read as anywhere: the cycle check covers them too.
IMPORT_CHECKED = (*PRODUCT, "benchmarks")
MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def _product_files(packages: tuple[str, ...] = PRODUCT) -> list[Path]:
    return sorted(
        path
        for pkg in packages
        for path in (ROOT / pkg).rglob("*.py")
        if not any(part.startswith(".") or part.endswith(".egg-info") for part in path.relative_to(ROOT).parts)
    )


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit() -> None:
    over = [f"{p.relative_to(ROOT)}: {n} lines" for p in _product_files() if (n := _lines(p)) > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


# Names two modules may share because they mean the same thing in each place: package markers,
# and base.py, the base class of one family (routing policies, length predictors).
SHARED_NAMES = frozenset({"__init__.py", "__main__.py", "base.py"})


def test_no_two_modules_share_a_name() -> None:
    """A reader who meets `views.py` twice cannot tell from the name which one a line means, so
    every other module name is used once across the product and the benchmarks."""
    by_name: dict[str, list[str]] = {}
    for path in _product_files((*PRODUCT, "benchmarks")):
        if path.name not in SHARED_NAMES:
            by_name.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    shared = [" ".join(paths) for paths in by_name.values() if len(paths) > 1]
    assert not shared, "modules sharing a name:\n" + "\n".join(shared)


def _long_classes(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: class {node.name}: {n} lines"
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and (n := (node.end_lineno or node.lineno) - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1)
        > MAX_CLASS_LINES
    ]


def test_no_class_is_over_the_limit() -> None:
    over = [hit for p in _product_files() for hit in _long_classes(p)]
    assert not over, f"classes over {MAX_CLASS_LINES} lines:\n" + "\n".join(over)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ours it imports (at any depth in the file), by grimp."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph(*IMPORT_CHECKED, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in edges.get(node, ()):
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(edges) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    cycles = _cycles(_import_graph())
    assert not cycles, "import cycles (each line: the modules of one circle):\n" + "\n".join(
        " <-> ".join(c) for c in cycles
    )
