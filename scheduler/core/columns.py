"""One pass's requests as numpy columns, read once and shared by the policy and the plan path.

A pass sees thousands of request views, and moving their fields into numpy is most of what a
vectorised decision costs. So `ViewColumns` reads each column on first use only, and while
`pass_columns.sharing(view)` is open (plan_path.plan_pass opens it around one policy.plan and
its finalize_plan) every `pass_columns.columns_of(view)` returns the same object, held on the
view itself (`PassColumns`): the policy's arrays, the queue timeouts, admission, the hold and
the sized levers all read one copy. Outside that scope every call reads the views afresh, so
nothing read in one pass can leak into the next.

What never changes about a view is read once per view, across passes, when the engine that
builds the views keeps a `RowCache` (see its contract); the rest is read every pass
(row_reads.py reads both).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, overload

import numpy as np

from scheduler.core.estimates import COMPOUND, DEADLINE, LATENCY, nan_as, output_bounds
from scheduler.core.packing import int64s
from scheduler.core.request_view import RequestView
from scheduler.core.row_reads import (
    DYNAMIC_ROWS,
    STATIC_ROWS,
    DynamicRow,
    SloTable,
    StaticRow,
    dynamic_rows,
    read_attained,
    read_be_tier,
    read_cached,
    read_generated,
    read_predicted,
    read_started,
    static_rows,
)


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
        rows = int64s([get(id(r), -1) for r in reqs], n)
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

    def set_tier(self, rows: Sequence[int], in_tier: Sequence[bool]) -> None:
        """These views' best-effort tier changed, nothing else (a plan moved them into or out
        of it): one row written, not the views' every per-pass number read again."""
        self.dyn[DynamicRow.BE_TIER, rows] = in_tier

    def set_generated(self, rows: Sequence[int] | np.ndarray, generated: Sequence[int] | np.ndarray) -> None:
        """These views' output counts changed, nothing else (a decode step), and with them their
        attained service, which the adapter's views count as prompt + output."""
        at = np.asarray(rows, dtype=np.int64)
        counts = np.asarray(generated, dtype=np.float64)
        self.dyn[DynamicRow.GENERATED, at] = counts
        self.dyn[DynamicRow.ATTAINED, at] = self.cols[StaticRow.PROMPT, at] + counts


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


class _PerPass:
    """A per-pass row of ViewColumns, on first use: the row of the block the caller gathered for
    this pass, or else read from the views (`flag`: a yes/no row, held as 0/1 in the block)."""

    def __init__(self, row: int, read: Callable[[Sequence[RequestView]], np.ndarray], flag: bool = False) -> None:
        self.row, self.read, self.flag = row, read, flag

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, columns: ViewColumns, owner: type | None = None) -> np.ndarray:
        d = columns._dynamic
        if d is None:
            value = self.read(columns.reqs)
        else:
            value = d[self.row] != 0 if self.flag else d[self.row]
        columns.__dict__[self.name] = value
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

    arrival = _Static(StaticRow.ARRIVAL)
    prompt = _Static(StaticRow.PROMPT)
    max_new = _Static(StaticRow.MAX_NEW)  # nan: none
    base = _Static(StaticRow.BASE)  # `estimates.deadline_base` where a deadline exists, arrival elsewhere
    deadline = _Static(StaticRow.DEADLINE)  # `estimates.request_deadline` (nan: none)
    deadline_s = _Static(StaticRow.SPEC + SloTable.DEADLINE_S)  # the SLO's own deadline in seconds (nan: none)
    ttft_s = _Static(StaticRow.SPEC + SloTable.TTFT_S)  # nan: none
    tpot_s = _Static(StaticRow.SPEC + SloTable.TPOT_S)  # 0: none
    ttft_ms = _Static(StaticRow.SPEC + SloTable.TTFT_MS)  # nan: none
    tpot_ms = _Static(StaticRow.SPEC + SloTable.TPOT_MS)  # nan: none
    weight = _Static(StaticRow.SPEC + SloTable.WEIGHT)
    max_queue_s = _Static(StaticRow.SPEC + SloTable.MAX_QUEUE_S)  # nan: none
    share = _Static(StaticRow.SHARE)  # the tenant's share of contended capacity

    @_Once
    def tenant(self) -> np.ndarray:
        """`tenant_id` of each request's tenant (-1: none)."""
        return self._gather(StaticRow.TENANT).astype(np.int64)

    @_Once
    def end_to_end_deadline(self) -> np.ndarray:
        """Absolute deadline of the request's whole SLO, a compound stage's program deadline
        rather than its sub-deadline (nan: none)."""
        return self.base + self.deadline_s

    # -- per pass: read from the views on first use --------------------------------------------

    generated = _PerPass(DynamicRow.GENERATED, read_generated)
    cached = _PerPass(DynamicRow.CACHED, read_cached)
    started = _PerPass(DynamicRow.STARTED, read_started, flag=True)
    predicted = _PerPass(DynamicRow.PREDICTED, read_predicted)
    be_tier = _PerPass(DynamicRow.BE_TIER, read_be_tier, flag=True)
    attained = _PerPass(DynamicRow.ATTAINED, read_attained)

    # -- derived -----------------------------------------------------------------------------------

    @_Once
    def cls(self) -> np.ndarray:
        """Class codes (estimates.LATENCY, DEADLINE, COMPOUND, BEST_EFFORT)."""
        return self._gather(StaticRow.SPEC + SloTable.CLS).astype(np.int64)

    @_Once
    def rejects(self) -> np.ndarray:
        """`on_infeasible: reject`."""
        return self._gather(StaticRow.SPEC + SloTable.REJECTS) != 0

    @_Once
    def running(self) -> np.ndarray:
        mask = np.zeros(self.n, dtype=bool)
        mask[self.n_waiting :] = True
        return mask

    @_Once
    def group(self) -> np.ndarray:
        """Compound (program, stage) group index, -1 otherwise (only the partition means anything)."""
        key = self._gather(StaticRow.GROUP_KEY)
        comp = key >= 0
        if not comp.any():
            return np.full(self.n, -1, dtype=np.int64)
        if key.max() < 4 * self.n + 64:  # the table's keys are small already: used as they are
            return np.where(comp, key, -1.0).astype(np.int64)
        gidx = np.full(self.n, -1, dtype=np.int64)
        gidx[comp] = np.unique(key[comp], return_inverse=True)[1]  # renumbered: group_reduce sizes by the top
        return gidx

    @_Once
    def running_kv(self) -> int:
        """KV tokens the running requests attend (whole token counts: the float sum is exact)."""
        nw = self.n_waiting
        return int((self.prompt[nw:] + self.generated[nw:]).sum())

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
        return token_due_of(self.arrival[rows], self.ttft_ms[rows], self.tpot_ms[rows], index)

    def total_out(self, default_output_len: float) -> np.ndarray:
        """`estimates.output_bound` of each request (upper-bound total output length)."""
        out = self._total_out.get(default_output_len)
        if out is None:
            out = self._total_out[default_output_len] = output_bounds(
                self.predicted, self.max_new, self.generated, default_output_len
            )
        return out


def token_due_of(arrival: np.ndarray, ttft_ms: np.ndarray, tpot_ms: np.ndarray, index: np.ndarray) -> np.ndarray:
    """`estimates.token_due` of output token `index`, as columns (nan without a TTFT)."""
    return arrival + (ttft_ms + index * nan_as(tpot_ms, 0.0)) / 1000.0


def rows_among(rows: np.ndarray, among: np.ndarray) -> np.ndarray:
    """Which of `rows` are in `among` (RowCache rows: small non-negative ints), as a mask: one
    scatter into a table of the rows, which np.isin's table kind also builds, without its
    checks (a visible share of a pass at 1 000 waiting)."""
    if rows.size == 0 or among.size == 0:
        return np.zeros(rows.size, dtype=bool)
    table = np.zeros(max(int(rows.max()), int(among.max())) + 1, dtype=bool)
    table[among] = True
    return table[rows]


@dataclass
class PassColumns:
    """One pass's columns, held on its EngineView while pass_columns.sharing has it open: read
    on first use (with the engine's RowCache, if it keeps one), then the same copy for every
    reader of that pass."""

    cache: RowCache | None = None
    columns: ViewColumns | None = None
