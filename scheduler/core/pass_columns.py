"""The columns of the pass being planned, shared through the view that every reader is handed.

plan_path.plan_pass opens `sharing(view, cache)` around one policy.plan and its finalize_plan:
while it is open, `columns_of(view)` reads the view's requests once and returns that copy to
every caller (the policy, the queue timeouts, admission, the hold, the sized levers). The copy
lives on the view (`EngineView.pass_columns`), the argument each of them already takes, so no
state outside the call is involved: another view, or the same view after the pass, reads its
requests afresh.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from scheduler.core.columns import PassColumns, RowCache, ViewColumns
from scheduler.core.row_reads import SloTable
from scheduler.core.types import EngineView


@contextmanager
def sharing(view: EngineView, cache: RowCache | None = None) -> Iterator[None]:
    """While open, `columns_of(view)` reads `view` once and returns that copy to every caller.
    Only for the span of one pass: the views must not change while it is open."""
    saved = view.pass_columns
    view.pass_columns = PassColumns(cache)
    try:
        yield
    finally:
        view.pass_columns = saved


def columns_read(view: EngineView) -> ViewColumns | None:
    """`view`'s columns if this pass has read them already (inside `sharing(view)`), else None:
    a check that needs little of them may be cheaper on the views themselves."""
    shared = view.pass_columns
    return shared.columns if shared is not None else None


def columns_of(view: EngineView, slos: SloTable | None = None) -> ViewColumns:
    """`view`'s columns: the pass's shared copy inside `sharing(view)`, else read now."""
    shared = view.pass_columns
    if shared is None:
        return ViewColumns.read(view.waiting, view.running, None, slos, view.known_rows)
    if shared.columns is None:
        shared.columns = ViewColumns.read(view.waiting, view.running, shared.cache, slos, view.known_rows)
    return shared.columns
