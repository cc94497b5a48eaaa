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

import itertools
import math
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

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


def _none_is_zero(ms: np.ndarray) -> np.ndarray:
    """`x or 0.0` of a column with nan for None (an infinite value stays infinite)."""
    return np.where(np.isnan(ms), 0.0, ms)


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
            add[self.TPOT_S] = _none_is_zero(add[self.TPOT_MS]) / 1000.0
            add[self.WEIGHT] = _floats([s.weight for s in new], m)
            add[self.CLS] = [_CLASS_BY_ID[id(s.slo_class)] for s in new]
            add[self.MAX_QUEUE_S] = _floats([nan if (x := s.max_queue_ms) is None else x for s in new], m) / 1000.0
            add[self.REJECTS] = [s.on_infeasible == REJECT_WHEN_INFEASIBLE for s in new]
            self.cols = np.concatenate([self.cols, add], axis=1)
        return found


# Row layout of a request's static numbers: its own, then its spec's (SloTable's order).
_ARRIVAL, _PROMPT, _MAX_NEW, _BASE, _DEADLINE, _GROUP_KEY, _TENANT, _SHARE = range(8)
_SPEC = 8  # first spec row
STATIC_ROWS = _SPEC + SloTable.ROWS


_TENANT_IDS: dict[str, int] = {}  # tenant name -> id, for this process's life (names come from its key file)


def tenant_id(name: str) -> int:
    """A small stable number for a tenant (a key's name): ids outlive any one RowCache."""
    found = _TENANT_IDS.get(name)
    if found is None:
        found = _TENANT_IDS.setdefault(name, len(_TENANT_IDS))
    return found


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
    dl_rows = (~np.isnan(deadline_s)).nonzero()[0]
    if dl_rows.size:
        sub = [reqs[i] for i in dl_rows.tolist()]
        m = len(sub)
        program_arrival = _floats([nan if (x := r.program_arrival) is None else x for r in sub], m)
        stage = _floats([nan if (x := r.stage_deadline) is None else x for r in sub], m)
        sub_arrival = arrival[dl_rows]
        out[_BASE, dl_rows] = deadline_bases(sub_arrival, program_arrival)
        out[_DEADLINE, dl_rows] = absolute_deadlines(deadline_s[dl_rows], sub_arrival, program_arrival, stage)
    out[_TENANT] = _floats([-1 if (t := r.tenant) is None else tenant_id(t) for r in reqs], n)
    out[_SHARE] = _floats([r.share for r in reqs], n)
    out[_GROUP_KEY] = -1
    for i in (out[_SPEC + SloTable.CLS] == COMPOUND).nonzero()[0].tolist():
        slo = reqs[i].slo
        if slo.program_id is not None:
            out[_GROUP_KEY, i] = groups.setdefault((slo.program_id, slo.stage), len(groups))
    return out


# Row layout of a request's per-pass numbers (what an engine refreshes between passes).
_GENERATED, _CACHED, _STARTED, _PREDICTED, _BE_TIER, _ATTAINED = range(6)
DYNAMIC_ROWS = 6


def _read_generated(reqs: Sequence[RequestView]) -> np.ndarray:
    return _floats([r.generated for r in reqs], len(reqs))


def _read_cached(reqs: Sequence[RequestView]) -> np.ndarray:
    return _floats([r.prefix_cached for r in reqs], len(reqs))


def _read_started(reqs: Sequence[RequestView]) -> np.ndarray:
    return _bools([r.first_token_time is not None for r in reqs], len(reqs))


def _read_predicted(reqs: Sequence[RequestView]) -> np.ndarray:
    nan = math.nan
    return _floats([nan if (x := r.predicted_output_len) is None else x for r in reqs], len(reqs))


def _read_be_tier(reqs: Sequence[RequestView]) -> np.ndarray:
    return _bools([r.best_effort_tier for r in reqs], len(reqs))


def _read_attained(reqs: Sequence[RequestView]) -> np.ndarray:
    return _floats([r.attained_service for r in reqs], len(reqs))


def _dynamic_row(r: RequestView) -> tuple[float, float, bool, float, bool, float]:
    """One view's per-pass numbers in `dynamic_rows`' layout."""
    predicted = r.predicted_output_len
    return (
        r.generated,
        r.prefix_cached,
        r.first_token_time is not None,
        math.nan if predicted is None else predicted,
        r.best_effort_tier,
        r.attained_service,
    )


def dynamic_rows(reqs: Sequence[RequestView]) -> np.ndarray:
    """(DYNAMIC_ROWS, len(reqs)): these views' per-pass numbers as they are now."""
    if len(reqs) <= 4:  # a pass's few refreshed views: a column each costs more than the views
        return np.array([_dynamic_row(r) for r in reqs], dtype=np.float64).reshape(len(reqs), DYNAMIC_ROWS).T
    out = np.empty((DYNAMIC_ROWS, len(reqs)))
    out[_GENERATED] = _read_generated(reqs)
    out[_CACHED] = _read_cached(reqs)
    out[_STARTED] = _read_started(reqs)
    out[_PREDICTED] = _read_predicted(reqs)
    out[_BE_TIER] = _read_be_tier(reqs)
    out[_ATTAINED] = _read_attained(reqs)
    return out


class RowCache:
    """Each view's static numbers (`static_rows`), kept across passes by view identity, and its
    per-pass numbers (`dynamic_rows`, in `dyn`) as of when it was added or last rewritten: those
    are current only where the cache's owner rewrites them as it changes the views (the
    adapter's ViewBuilder, which then hands them over as `PassRows`); `rows()` users read the
    per-pass numbers from the views.

    Contract with the engine that builds the views and keeps this cache: once a RequestView
    exists, its rid, slo, arrival, prompt_len, max_new_tokens, program_arrival,
    stage_deadline, tenant and share are never reassigned. The SGLang adapter's ViewBuilder and the simulator's
    SimEngine keep to it: across passes they refresh only generated, prefix_cached,
    first_token_time, predicted_output_len, attained_service and best_effort_tier, which
    ViewColumns reads every pass. A request whose static fields change gets a new view (the
    oracle variant's `dataclasses.replace`, a cluster's re-routed request), which the cache
    reads as new. The cache holds a reference to every view it knows, so an id is never reused
    while cached; views no longer seen are dropped when the cache grows well past the live set."""

    def __init__(self, slack: int = 4096) -> None:
        self.slack = slack
        self.slos = SloTable()
        self._clear()

    def _clear(self) -> None:
        self.epoch = next(_EPOCHS)  # rows mean the same views while this stays the same
        self._index: dict[int, int] = {}  # id(view) -> row
        self._groups: dict[tuple[object, object], int] = {}
        self._size = 0
        self.cols = np.empty((STATIC_ROWS, 0))  # static numbers, a column per row
        self.dyn = np.empty((DYNAMIC_ROWS, 0))  # per-pass numbers, as of their last `rewrite`
        self.rid_array = np.empty(0, dtype=object)  # row -> rid
        self._views = np.empty(0, dtype=object)  # row -> view: held, so no id is reused while cached

    def __len__(self) -> int:
        return self._size

    def rows(self, reqs: Sequence[RequestView]) -> np.ndarray:
        """The row in `cols` of each view, reading the views not cached yet. Found by identity,
        which reads no view: a queue in the policy's order is scattered in memory, and at
        thousands of requests each walk over the views costs a cache miss per view."""
        n = len(reqs)
        get = self._index.get
        rows = _int64s([get(id(r), -1) for r in reqs], n)
        if n and rows.min() < 0:
            if self._size > 2 * n + self.slack:
                self._clear()  # evict views no longer in use
                rows[:] = -1
            rows = self._add(reqs, rows)
        return rows

    def _add(self, reqs: Sequence[RequestView], rows: np.ndarray) -> np.ndarray:
        missing = (rows < 0).nonzero()[0].tolist()
        self.append(list({id(r): r for r in (reqs[i] for i in missing)}.values()))  # each new view once
        index = self._index
        rows[missing] = [index[id(reqs[i])] for i in missing]
        return rows

    def append(self, new: Sequence[RequestView]) -> np.ndarray:
        """Rows for views this cache has not seen (the caller knows they are new), read now.
        Rows are only ever appended: a ViewColumns holding the previous arrays stays right."""
        first = self._size
        size = self._size = first + len(new)
        self._index.update(zip(map(id, new), range(first, size)))
        if size > self.cols.shape[1]:  # grow by doubling: a pass adds a few arrivals
            cap = max(size, 2 * self.cols.shape[1], 64)
            self.cols = _grown(self.cols, cap, first)
            self.dyn = _grown(self.dyn, cap, first)
            self.rid_array = _grown(self.rid_array, cap, first)
            self._views = _grown(self._views, cap, first)
        self.cols[:, first:size] = static_rows(new, self.slos, self._groups)
        self.dyn[:, first:size] = dynamic_rows(new)
        self.rid_array[first:size] = [r.rid for r in new]
        self._views[first:size] = new
        return np.arange(first, size)

    def views_at(self, rows: np.ndarray) -> list[RequestView]:
        """The views at these rows (one gather, no Python step per view)."""
        return self._views[rows].tolist()

    def rewrite(self, rows: Sequence[int], views: Sequence[RequestView]) -> None:
        """The per-pass numbers of these views (at these rows) changed: read them again."""
        if views:
            self.dyn[:, rows] = dynamic_rows(views)

    def set_generated(self, rows: Sequence[int] | np.ndarray, generated: Sequence[int] | np.ndarray) -> None:
        """These views' output counts changed, nothing else (a decode step), and with them their
        attained service, which the adapter's views count as prompt + output."""
        at = np.asarray(rows, dtype=np.int64)
        counts = np.asarray(generated, dtype=np.float64)
        self.dyn[_GENERATED, at] = counts
        self.dyn[_ATTAINED, at] = self.cols[_PROMPT, at] + counts


_EPOCHS = itertools.count()  # RowCache.epoch: unique across caches, so rows from another never match


def _grown(a: np.ndarray, cap: int, used: int) -> np.ndarray:
    """`a` with room for `cap` entries along its last axis, the first `used` kept."""
    out = np.empty((*a.shape[:-1], cap), dtype=a.dtype)
    out[..., :used] = a[..., :used]
    return out


@dataclass(frozen=True)
class PassRows:
    """Where an engine that keeps a RowCache up to date itself (the SGLang adapter's
    ViewBuilder) has this pass's views: `rows[i]` is the row of `[*waiting, *running][i]`, whose
    static and per-pass numbers are current in `cache`. Then a pass reads no view at all for
    its columns. Holds only for these very lists: a view made from another list (an oracle
    variant's, a test's `replace`) is read as usual. The engine keeps one view per request for
    the request's life, so a request keeps its row while the cache's epoch stays the same."""

    cache: RowCache
    rows: np.ndarray
    waiting: Sequence[RequestView]
    running: Sequence[RequestView]


_T = TypeVar("_T")


class _Once(Generic[_T]):
    """functools.cached_property without its lock (3.11 takes one per first read, a visible
    share of a pass that reads a dozen columns): ViewColumns live within one thread's pass."""

    def __init__(self, read: Callable[[Any], _T]) -> None:
        self.read = read
        self.name = read.__name__

    @overload
    def __get__(self, columns: None, owner: type | None = None) -> _Once[_T]: ...
    @overload
    def __get__(self, columns: object, owner: type | None = None) -> _T: ...
    def __get__(self, columns: object | None, owner: type | None = None) -> _Once[_T] | _T:
        if columns is None:
            return self
        value = columns.__dict__[self.name] = self.read(columns)
        return value


class _Static:
    """A static row of ViewColumns, gathered on first use and then kept on the instance."""

    def __init__(self, row: int) -> None:
        self.row = row

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, columns: ViewColumns, owner: type | None = None) -> np.ndarray:
        value = columns.__dict__[self.name] = columns._gather(self.row)
        return value


class ViewColumns:
    """Requests as columns, waiting first, then running. Static numbers come with it (see
    `static_rows`); what may change between passes is read from the views on first use, so a
    pass pays only for the columns someone asks for."""

    def __init__(
        self,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        rid_array: np.ndarray,
        static: np.ndarray,
        rows: np.ndarray | None = None,
        dynamic: np.ndarray | None = None,
    ) -> None:
        """`rid_array`: the rids as an object array (a gather of rids is then one numpy call);
        `static`: the static numbers (`static_rows`), the requests' own or, with `rows`, a
        RowCache's (request i at column rows[i]); `dynamic`: the per-pass numbers
        (`dynamic_rows`) when known, else they are read from the views on first use."""
        self.reqs = [*waiting, *running]
        self.n = len(self.reqs)
        self.n_waiting = len(waiting)
        self.rid_array = rid_array
        self._static, self._rows, self._dynamic = static, rows, dynamic
        self._epoch: int | None = None  # with known rows: the RowCache's epoch they belong to
        self._total_out: dict[float, np.ndarray] = {}

    @classmethod
    def read(
        cls,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        cache: RowCache | None = None,
        slos: SloTable | None = None,
        known: PassRows | None = None,
    ) -> ViewColumns:
        """Columns of these views: every number from `known` when it holds for these lists,
        else static numbers from `cache` when given, else read now (with `slos` when given: a
        long-lived table reads each spec once)."""
        if known is not None and known.waiting is waiting and known.running is running:
            rows, held = known.rows, known.cache
            out = cls(waiting, running, held.rid_array[rows], held.cols, rows, held.dyn.take(rows, axis=1))
            out._epoch = held.epoch
            return out
        reqs = [*waiting, *running]
        if cache is not None:
            rows = cache.rows(reqs)  # may grow the cache's arrays: take them after
            return cls(waiting, running, cache.rid_array[rows], cache.cols, rows)
        rids = np.empty(len(reqs), dtype=object)
        rids[:] = [r.rid for r in reqs]
        return cls(waiting, running, rids, static_rows(reqs, slos if slos is not None else SloTable(), {}))

    def _gather(self, row: int) -> np.ndarray:
        """Static row `row` of these requests, gathered on first use (a pass reads only some)."""
        numbers = self._static[row]
        return numbers if self._rows is None else numbers.take(self._rows)

    @_Once
    def rids(self) -> list[str]:
        return self.rid_array.tolist()

    def row_keys(self) -> tuple[int, np.ndarray] | None:
        """(an epoch, each request's row in the engine's RowCache), where the engine keeps the rows
        (PassRows: one view per request for its life, so one row). While a later pass's epoch is
        the same, a request has the row it had, so a policy finds the requests it noted on an
        earlier pass without a lookup per request. None: no such rows (a policy then goes by
        rid)."""
        if self._rows is None or self._epoch is None:
            return None
        return self._epoch, self._rows

    # -- static: never change for a view ------------------------------------------------------

    arrival = _Static(_ARRIVAL)
    prompt = _Static(_PROMPT)
    max_new = _Static(_MAX_NEW)  # nan: none
    base = _Static(_BASE)  # `estimates.deadline_base` where a deadline exists, arrival elsewhere
    deadline = _Static(_DEADLINE)  # `estimates.request_deadline` (nan: none)
    deadline_s = _Static(_SPEC + SloTable.DEADLINE_S)  # the SLO's own deadline in seconds (nan: none)
    ttft_s = _Static(_SPEC + SloTable.TTFT_S)  # nan: none
    tpot_s = _Static(_SPEC + SloTable.TPOT_S)  # 0: none
    ttft_ms = _Static(_SPEC + SloTable.TTFT_MS)  # nan: none
    tpot_ms = _Static(_SPEC + SloTable.TPOT_MS)  # nan: none
    weight = _Static(_SPEC + SloTable.WEIGHT)
    max_queue_s = _Static(_SPEC + SloTable.MAX_QUEUE_S)  # nan: none
    share = _Static(_SHARE)  # the tenant's share of contended capacity

    @_Once
    def tenant(self) -> np.ndarray:
        """`tenant_id` of each request's tenant (-1: none)."""
        return self._gather(_TENANT).astype(np.int64)

    @_Once
    def end_to_end_deadline(self) -> np.ndarray:
        """Absolute deadline of the request's whole SLO, a compound stage's program deadline
        rather than its sub-deadline (nan: none)."""
        return self.base + self.deadline_s

    # -- per pass: read from the views on first use --------------------------------------------

    @_Once
    def generated(self) -> np.ndarray:
        d = self._dynamic
        return d[_GENERATED] if d is not None else _read_generated(self.reqs)

    @_Once
    def cached(self) -> np.ndarray:
        d = self._dynamic
        return d[_CACHED] if d is not None else _read_cached(self.reqs)

    @_Once
    def started(self) -> np.ndarray:
        d = self._dynamic
        return d[_STARTED] != 0 if d is not None else _read_started(self.reqs)

    @_Once
    def predicted(self) -> np.ndarray:
        d = self._dynamic
        return d[_PREDICTED] if d is not None else _read_predicted(self.reqs)

    @_Once
    def be_tier(self) -> np.ndarray:
        d = self._dynamic
        return d[_BE_TIER] != 0 if d is not None else _read_be_tier(self.reqs)

    @_Once
    def attained(self) -> np.ndarray:
        d = self._dynamic
        return d[_ATTAINED] if d is not None else _read_attained(self.reqs)

    # -- derived -----------------------------------------------------------------------------------

    @_Once
    def cls(self) -> np.ndarray:
        """Class codes (estimates.LATENCY, DEADLINE, COMPOUND, BEST_EFFORT)."""
        return self._gather(_SPEC + SloTable.CLS).astype(np.int64)

    @_Once
    def rejects(self) -> np.ndarray:
        """`on_infeasible: reject`."""
        return self._gather(_SPEC + SloTable.REJECTS) != 0

    @_Once
    def running(self) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        mask[self.n_waiting :] = True
        return mask

    @_Once
    def group(self) -> np.ndarray:
        """Compound (program, stage) group index, -1 otherwise (only the partition means anything)."""
        key = self._gather(_GROUP_KEY)
        comp = key >= 0
        if not comp.any():
            return np.full(self.n, -1, dtype=np.int64)
        if key.max() < 4 * self.n + 64:  # the table's keys are small already: used as they are
            return np.where(comp, key, -1.0).astype(np.int64)
        gidx = np.full(self.n, -1, dtype=np.int64)
        gidx[comp] = np.unique(key[comp], return_inverse=True)[1]  # renumbered: group_reduce sizes by the top
        return gidx

    @_Once
    def next_due(self) -> np.ndarray:
        """`estimates.next_deadline` of each request (nan: none): the next token's due time for
        latency requests, the end-to-end (stage) deadline for deadline and compound ones."""
        cls = self.cls
        due = np.where((cls == DEADLINE) | (cls == COMPOUND), self.deadline, math.nan)
        return np.where(cls == LATENCY, self.token_due(self.generated), due)

    @_Once
    def losing_due(self) -> np.ndarray:
        """`estimates.losing_deadline` of each request (nan: none): `next_due`, but a compound
        stage's program deadline rather than its sub-deadline."""
        return np.where(self.cls == COMPOUND, self.end_to_end_deadline, self.next_due)

    def token_due(self, index: np.ndarray, rows: slice = slice(None)) -> np.ndarray:
        """`estimates.token_due` of output token `index` of the requests at `rows` (nan without
        a TTFT), with the scalar form's arithmetic: arrival + (TTFT + index·TPOT) / 1000."""
        tpot = _none_is_zero(self.tpot_ms[rows])
        return self.arrival[rows] + (self.ttft_ms[rows] + index * tpot) / 1000.0

    def total_out(self, default_output_len: float) -> np.ndarray:
        """`estimates.output_bound` of each request (upper-bound total output length)."""
        out = self._total_out.get(default_output_len)
        if out is None:
            out = self._total_out[default_output_len] = output_bounds(
                self.predicted, self.max_new, self.generated, default_output_len
            )
        return out


def rows_among(rows: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of `rows` are in `among` (RowCache rows: small non-negative ints), as a mask: one
    scatter into a table of the rows, which np.isin's table kind also builds, without its
    checks (a visible share of a pass at 1 000 waiting)."""
    if rows.size == 0 or among.size == 0:
        return np.zeros(rows.size, dtype=bool)
    table = np.zeros(max(int(rows.max()), int(among.max())) + 1, dtype=bool)
    table[among] = True
    return table[rows]


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


def columns_read(view: EngineView) -> ViewColumns | None:
    """`view`'s columns if this pass has read them already (inside `sharing(view)`), else None:
    a check that needs little of them may be cheaper on the views themselves."""
    shared = _PASS
    return shared.columns if shared.view is view else None


def columns_of(view: EngineView, slos: SloTable | None = None) -> ViewColumns:
    """`view`'s columns: the pass's shared copy inside `sharing(view)`, else read now."""
    shared = _PASS
    if shared.view is not view:
        return ViewColumns.read(view.waiting, view.running, None, slos, view.known_rows)
    if shared.columns is None:
        shared.columns = ViewColumns.read(view.waiting, view.running, shared.cache, slos, view.known_rows)
    return shared.columns
