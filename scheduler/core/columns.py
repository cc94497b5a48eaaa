"""One pass's requests as numpy columns, read once and shared by the policy and the plan path.

A pass sees thousands of request views, and moving their fields into numpy is most of what a
vectorised decision costs. So `ViewColumns` reads each column on first use only, and while
`sharing(view)` is open (plan_path.plan_pass opens it around one policy.plan and its
finalize_plan) every `columns_of(view)` returns the same object: the policy's arrays, the
queue timeouts, admission, the hold and the batch knobs all read one copy. Outside that scope
every call reads the views afresh, so nothing read in one pass can leak into the next.

What never changes about a view is read once per view, across passes, when the engine that
builds the views keeps a `RowCache` (see its contract); the rest is read every pass.
"""

from __future__ import annotations

import math
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property

import numpy as np

from scheduler.core.estimates import (
    BEST_EFFORT,
    COMPOUND,
    DEADLINE,
    LATENCY,
    _floats,
    absolute_deadlines,
    deadline_bases,
    output_bounds,
)
from scheduler.core.slo import REJECT_WHEN_INFEASIBLE, SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView

_CLASS_BY_ID = {
    id(SloClass.LATENCY): LATENCY,
    id(SloClass.DEADLINE): DEADLINE,
    id(SloClass.COMPOUND): COMPOUND,
    id(SloClass.BEST_EFFORT): BEST_EFFORT,
}


def _bools(values: Sequence[object], n: int) -> np.ndarray:
    """The truth of these n values, packed as `estimates._floats` packs numbers."""
    out = np.empty(n, dtype=np.bool_)
    struct.pack_into(f"{n}?", out.data, 0, *values)
    return out


def _int64s(values: Sequence[int], n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.int64)
    struct.pack_into(f"{n}q", out.data, 0, *values)
    return out


class SloTable:
    """Per-SloSpec numbers, cached across passes by object identity, so each spec is read once.

    SloSpec is frozen, so a spec's numbers never change; the table holds a reference to every
    spec it caches, so an id cannot be recycled by another object while it is cached. Specs no
    longer seen are dropped when the table grows well past the live set."""

    # Row layout of `cols` (one column per cached spec); ms -> s is the division the scalar
    # estimates do, so both forms hold the same floats.
    DEADLINE_S, TTFT_S, TPOT_S, WEIGHT, CLS, MAX_QUEUE_S, TTFT_MS, TPOT_MS, REJECTS = range(9)
    ROWS = 9

    def __init__(self, slack: int = 4096) -> None:
        self.slack = slack
        self._clear()

    def _clear(self) -> None:
        self._index: dict[int, int] = {}
        self._specs: list[SloSpec] = []
        self.cols = np.empty((self.ROWS, 0))

    def __len__(self) -> int:
        return len(self._specs)

    def rows(self, reqs: Sequence[RequestView]) -> np.ndarray:
        """Column index in `cols` of each request's spec, adding the specs not cached yet."""
        get = self._index.get
        rows = [get(id(r.slo), -1) for r in reqs]
        if rows and min(rows) < 0:
            slos = [r.slo for r in reqs]
            if len(self._specs) > 2 * len(slos) + self.slack:
                self._clear()  # evict specs no longer in use
                rows = [-1] * len(slos)
            rows = self._add(slos, rows)
        return _int64s(rows, len(rows))

    def _add(self, slos: list[SloSpec], rows: Sequence[int]) -> list[int]:
        index, specs = self._index, self._specs
        first_new = len(specs)
        new = list({id(s): s for s, row in zip(slos, rows, strict=True) if row < 0}.values())
        index.update(zip(map(id, new), range(first_new, first_new + len(new))))
        specs.extend(new)
        get = index.__getitem__
        found = [get(id(s)) for s in slos]
        if new:
            nan = math.nan
            m = len(new)
            add = np.empty((self.ROWS, m))
            add[self.TTFT_MS] = _floats([nan if (x := s.ttft_ms) is None else x for s in new], m)
            add[self.TPOT_MS] = _floats([nan if (x := s.tpot_ms) is None else x for s in new], m)
            add[self.DEADLINE_S] = _floats([nan if (x := s.deadline_ms) is None else x for s in new], m) / 1000.0
            add[self.TTFT_S] = add[self.TTFT_MS] / 1000.0
            add[self.TPOT_S] = np.nan_to_num(add[self.TPOT_MS], nan=0.0) / 1000.0
            add[self.WEIGHT] = _floats([s.weight for s in new], m)
            add[self.CLS] = [_CLASS_BY_ID[id(s.slo_class)] for s in new]
            add[self.MAX_QUEUE_S] = _floats([nan if (x := s.max_queue_ms) is None else x for s in new], m) / 1000.0
            add[self.REJECTS] = [s.on_infeasible == REJECT_WHEN_INFEASIBLE for s in new]
            self.cols = np.concatenate([self.cols, add], axis=1)
        return found


# Row layout of a request's static numbers: its own, then its spec's (SloTable's order).
_ARRIVAL, _PROMPT, _MAX_NEW, _BASE, _DEADLINE, _GROUP_KEY = range(6)
_SPEC = 6  # first spec row
STATIC_ROWS = _SPEC + SloTable.ROWS


def static_rows(reqs: Sequence[RequestView], slos: SloTable, groups: dict[tuple[object, object], int]) -> np.ndarray:
    """(STATIC_ROWS, len(reqs)): what never changes about these views. `groups` numbers the
    compound (program, stage) groups; only the partition it makes is meaningful."""
    n = len(reqs)
    out = np.empty((STATIC_ROWS, n))
    spec_rows = slos.rows(reqs)  # may grow slos.cols: index it after
    out[_SPEC:] = slos.cols[:, spec_rows]
    nan = math.nan
    arrival = out[_ARRIVAL]
    arrival[:] = _floats([r.arrival for r in reqs], n)
    out[_PROMPT] = _floats([r.prompt_len for r in reqs], n)
    out[_MAX_NEW] = _floats([nan if (x := r.max_new_tokens) is None else x for r in reqs], n)
    # Program arrival and stage deadline only matter where a deadline exists: read them only
    # there (elsewhere base = arrival, deadline = nan).
    deadline_s = out[_SPEC + SloTable.DEADLINE_S]
    out[_BASE] = arrival
    out[_DEADLINE] = nan
    dl_rows = np.flatnonzero(~np.isnan(deadline_s))
    if dl_rows.size:
        sub = [reqs[i] for i in dl_rows.tolist()]
        m = len(sub)
        program_arrival = _floats([nan if (x := r.program_arrival) is None else x for r in sub], m)
        stage = _floats([nan if (x := r.stage_deadline) is None else x for r in sub], m)
        sub_arrival = arrival[dl_rows]
        out[_BASE, dl_rows] = deadline_bases(sub_arrival, program_arrival)
        out[_DEADLINE, dl_rows] = absolute_deadlines(deadline_s[dl_rows], sub_arrival, program_arrival, stage)
    out[_GROUP_KEY] = -1
    for i in np.flatnonzero(out[_SPEC + SloTable.CLS] == COMPOUND).tolist():
        slo = reqs[i].slo
        if slo.program_id is not None:
            out[_GROUP_KEY, i] = groups.setdefault((slo.program_id, slo.stage), len(groups))
    return out


class RowCache:
    """Each view's static numbers (`static_rows`), kept across passes for the same view object.

    Contract with the engine that builds the views and keeps this cache: once a RequestView
    exists, its rid, slo, arrival, prompt_len, max_new_tokens, program_arrival and
    stage_deadline are never reassigned. The SGLang adapter's ViewBuilder and the simulator's
    SimEngine keep to it: across passes they refresh only generated, prefix_cached,
    first_token_time, predicted_output_len, attained_service and best_effort_tier, which
    ViewColumns reads every pass. A request whose static fields change gets a new view (the
    oracle variant's `dataclasses.replace`, a cluster's re-routed request), which the cache
    reads as new: a row is found by rid and used only if it holds that very view (the cache
    keeps a reference to every view it knows). Views no longer seen are dropped when the cache
    grows well past the live set."""

    def __init__(self, slack: int = 4096) -> None:
        self.slack = slack
        self.slos = SloTable()
        self._clear()

    def _clear(self) -> None:
        self._index: dict[str, int] = {}  # rid -> row of the view last read under it
        self._views: list[RequestView] = []  # row -> view (held: identity checks stay exact)
        self._groups: dict[tuple[object, object], int] = {}
        self._cols = np.empty((STATIC_ROWS, 0))
        self._rids = np.empty(0, dtype=object)

    def __len__(self) -> int:
        return len(self._views)

    def lookup(self, reqs: Sequence[RequestView]) -> tuple[np.ndarray, np.ndarray]:
        """(static numbers, rids as an object array) of these views, reading the views not
        cached yet. Found by rid (a string key hashes once), kept only if it is the same view."""
        get, views = self._index.get, self._views
        rows = _int64s([row if (row := get(r.rid, -1)) >= 0 and views[row] is r else -1 for r in reqs], len(reqs))
        if rows.size and rows.min() < 0:
            if len(views) > 2 * len(reqs) + self.slack:
                self._clear()  # evict views no longer in use
                rows[:] = -1
            rows = self._add(reqs, rows)
        return np.take(self._cols, rows, axis=1), self._rids[rows]

    def _add(self, reqs: Sequence[RequestView], rows: np.ndarray) -> np.ndarray:
        missing = np.flatnonzero(rows < 0).tolist()
        new = list({id(r): r for r in (reqs[i] for i in missing)}.values())  # each new view once
        first = len(self._views)
        row_of = {id(r): row for row, r in enumerate(new, first)}
        self._views.extend(new)
        self._index.update((r.rid, row_of[id(r)]) for r in new)
        size = len(self._views)
        if size > self._cols.shape[1]:  # grow by doubling: a pass adds a few arrivals
            cap = max(size, 2 * self._cols.shape[1], 64)
            cols, rids = np.empty((STATIC_ROWS, cap)), np.empty(cap, dtype=object)
            cols[:, :first], rids[:first] = self._cols[:, :first], self._rids[:first]
            self._cols, self._rids = cols, rids
        self._cols[:, first:size] = static_rows(new, self.slos, self._groups)
        self._rids[first:size] = [r.rid for r in new]
        rows[missing] = [row_of[id(reqs[i])] for i in missing]
        return rows


class ViewColumns:
    """Requests as columns, waiting first, then running. Static numbers come with it (see
    `static_rows`); what may change between passes is read from the views on first use, so a
    pass pays only for the columns someone asks for."""

    def __init__(
        self, waiting: Sequence[RequestView], running: Sequence[RequestView], static: np.ndarray, rids: np.ndarray
    ) -> None:
        self.reqs = [*waiting, *running]
        self.n = len(self.reqs)
        self.n_waiting = len(waiting)
        self.rid_array = rids  # object array: a gather of rids is one numpy call
        self.arrival, self.prompt, self.max_new, self.base, self.deadline, self._group_key = static[:_SPEC]
        spec = static[_SPEC:]
        self.deadline_s = spec[SloTable.DEADLINE_S]
        self.ttft_s = spec[SloTable.TTFT_S]  # nan: none
        self.tpot_s = spec[SloTable.TPOT_S]  # 0: none
        self.ttft_ms = spec[SloTable.TTFT_MS]  # nan: none
        self.tpot_ms = spec[SloTable.TPOT_MS]  # nan: none
        self.weight = spec[SloTable.WEIGHT]
        self.max_queue_s = spec[SloTable.MAX_QUEUE_S]  # nan: none
        self._cls = spec[SloTable.CLS]
        self._rejects = spec[SloTable.REJECTS]
        self._total_out: dict[float, np.ndarray] = {}

    @classmethod
    def read(
        cls,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        cache: RowCache | None = None,
        slos: SloTable | None = None,
    ) -> ViewColumns:
        """Columns of these views: static numbers from `cache` when given, else read now
        (with `slos` when given: a long-lived table reads each spec once)."""
        reqs = [*waiting, *running]
        if cache is not None:
            static, rids = cache.lookup(reqs)
        else:
            static = static_rows(reqs, slos if slos is not None else SloTable(), {})
            rids = np.empty(len(reqs), dtype=object)
            rids[:] = [r.rid for r in reqs]
        return cls(waiting, running, static, rids)

    @cached_property
    def rids(self) -> list[str]:
        return self.rid_array.tolist()

    # -- per pass: read from the views on first use --------------------------------------------

    @cached_property
    def generated(self) -> np.ndarray:
        return _floats([r.generated for r in self.reqs], self.n)

    @cached_property
    def cached(self) -> np.ndarray:
        return _floats([r.prefix_cached for r in self.reqs], self.n)

    @cached_property
    def started(self) -> np.ndarray:
        return _bools([r.first_token_time is not None for r in self.reqs], self.n)

    @cached_property
    def predicted(self) -> np.ndarray:
        nan = math.nan
        return _floats([nan if (x := r.predicted_output_len) is None else x for r in self.reqs], self.n)

    @cached_property
    def be_tier(self) -> np.ndarray:
        return _bools([r.best_effort_tier for r in self.reqs], self.n)

    @cached_property
    def attained(self) -> np.ndarray:
        return _floats([r.attained_service for r in self.reqs], self.n)

    # -- derived -----------------------------------------------------------------------------------

    @cached_property
    def cls(self) -> np.ndarray:
        """Class codes (estimates.LATENCY, DEADLINE, COMPOUND, BEST_EFFORT)."""
        return self._cls.astype(np.int64)

    @cached_property
    def rejects(self) -> np.ndarray:
        """`on_infeasible: reject`."""
        return self._rejects != 0

    @cached_property
    def running(self) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        mask[self.n_waiting :] = True
        return mask

    @cached_property
    def group(self) -> np.ndarray:
        """Compound (program, stage) group index, -1 otherwise (only the partition means anything)."""
        key = self._group_key
        gidx = np.full(self.n, -1, dtype=np.int64)
        comp = key >= 0
        if comp.any():
            gidx[comp] = np.unique(key[comp], return_inverse=True)[1]
        return gidx

    @cached_property
    def next_due(self) -> np.ndarray:
        """`estimates.next_deadline` of each request (nan: none): the next token's due time for
        latency requests, the end-to-end (stage) deadline for deadline and compound ones."""
        cls = self.cls
        due = np.where((cls == DEADLINE) | (cls == COMPOUND), self.deadline, math.nan)
        return np.where(cls == LATENCY, self.token_due(self.generated), due)

    def token_due(self, index: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        """`estimates.token_due` of output token `index` of the requests at `rows` (nan without
        a TTFT), with the scalar form's arithmetic: arrival + (TTFT + index·TPOT) / 1000."""
        tpot = np.nan_to_num(self.tpot_ms[rows], nan=0.0)
        return self.arrival[rows] + (self.ttft_ms[rows] + index * tpot) / 1000.0

    def total_out(self, default_output_len: float) -> np.ndarray:
        """`estimates.output_bound` of each request (upper-bound total output length)."""
        out = self._total_out.get(default_output_len)
        if out is None:
            out = self._total_out[default_output_len] = output_bounds(
                self.predicted, self.max_new, self.generated, default_output_len
            )
        return out


class _Pass(threading.local):
    """The view being planned on this thread, its columns once read, and its engine's cache."""

    view: EngineView | None = None
    columns: ViewColumns | None = None
    cache: RowCache | None = None


_PASS = _Pass()


@contextmanager
def sharing(view: EngineView, cache: RowCache | None = None) -> Iterator[None]:
    """While open, `columns_of(view)` reads `view` once and returns that copy to every caller.
    Only for the span of one pass: the views must not change while it is open."""
    saved = _PASS.view, _PASS.columns, _PASS.cache
    _PASS.view, _PASS.columns, _PASS.cache = view, None, cache
    try:
        yield
    finally:
        _PASS.view, _PASS.columns, _PASS.cache = saved


def columns_of(view: EngineView, slos: SloTable | None = None) -> ViewColumns:
    """`view`'s columns: the pass's shared copy inside `sharing(view)`, else read now."""
    shared = _PASS
    if shared.view is not view:
        return ViewColumns.read(view.waiting, view.running, None, slos)
    if shared.columns is None:
        shared.columns = ViewColumns.read(view.waiting, view.running, shared.cache, slos)
    return shared.columns
