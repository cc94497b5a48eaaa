"""Request views read into rows of numbers: what never changes about a request (its own static
fields and its SLO's, `static_rows`) and what an engine refreshes between passes
(`dynamic_rows`), in the row layouts `StaticRow` and `DynamicRow` that columns.RowCache keeps
and columns.ViewColumns gathers from. Each SLO spec is read once (`SloTable`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from scheduler.core.estimates import (
    BEST_EFFORT,
    COMPOUND,
    DEADLINE,
    LATENCY,
    absolute_deadlines,
    deadline_bases,
    nan_as,
)
from scheduler.core.packing import bools, floats, int64s
from scheduler.core.request_view import RequestView
from scheduler.core.slo import REJECT_WHEN_INFEASIBLE, SloClass, SloSpec

_CLASS_BY_ID = {
    id(SloClass.LATENCY): LATENCY,
    id(SloClass.DEADLINE): DEADLINE,
    id(SloClass.COMPOUND): COMPOUND,
    id(SloClass.BEST_EFFORT): BEST_EFFORT,
}


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
        return int64s(rows, len(rows))

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
            add[self.TTFT_MS] = floats([nan if (x := s.ttft_ms) is None else x for s in new], m)
            add[self.TPOT_MS] = floats([nan if (x := s.tpot_ms) is None else x for s in new], m)
            add[self.DEADLINE_S] = floats([nan if (x := s.deadline_ms) is None else x for s in new], m) / 1000.0
            add[self.TTFT_S] = add[self.TTFT_MS] / 1000.0
            add[self.TPOT_S] = nan_as(add[self.TPOT_MS], 0.0) / 1000.0
            add[self.WEIGHT] = floats([s.weight for s in new], m)
            add[self.CLS] = [_CLASS_BY_ID[id(s.slo_class)] for s in new]
            add[self.MAX_QUEUE_S] = floats([nan if (x := s.max_queue_ms) is None else x for s in new], m) / 1000.0
            add[self.REJECTS] = [s.on_infeasible == REJECT_WHEN_INFEASIBLE for s in new]
            self.cols = np.concatenate([self.cols, add], axis=1)
        return found


class StaticRow:
    """Row layout of a request's static numbers: its own, then its spec's (SloTable's order)."""

    ARRIVAL, PROMPT, MAX_NEW, BASE, DEADLINE, GROUP_KEY, TENANT, SHARE = range(8)
    SPEC = 8  # first spec row


STATIC_ROWS = StaticRow.SPEC + SloTable.ROWS


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
    out[StaticRow.SPEC :] = slos.cols[:, spec_rows]
    nan = math.nan
    arrival = out[StaticRow.ARRIVAL]
    arrival[:] = floats([r.arrival for r in reqs], n)
    out[StaticRow.PROMPT] = floats([r.prompt_len for r in reqs], n)
    out[StaticRow.MAX_NEW] = floats([nan if (x := r.max_new_tokens) is None else x for r in reqs], n)
    # Program arrival and stage deadline only matter where a deadline exists: read them only
    # there (elsewhere base = arrival, deadline = nan).
    deadline_s = out[StaticRow.SPEC + SloTable.DEADLINE_S]
    out[StaticRow.BASE] = arrival
    out[StaticRow.DEADLINE] = nan
    dl_rows = (~np.isnan(deadline_s)).nonzero()[0]
    if dl_rows.size:
        sub = [reqs[i] for i in dl_rows.tolist()]
        m = len(sub)
        program_arrival = floats([nan if (x := r.program_arrival) is None else x for r in sub], m)
        stage = floats([nan if (x := r.stage_deadline) is None else x for r in sub], m)
        sub_arrival = arrival[dl_rows]
        out[StaticRow.BASE, dl_rows] = deadline_bases(sub_arrival, program_arrival)
        out[StaticRow.DEADLINE, dl_rows] = absolute_deadlines(deadline_s[dl_rows], sub_arrival, program_arrival, stage)
    out[StaticRow.TENANT] = floats([-1 if (t := r.tenant) is None else tenant_id(t) for r in reqs], n)
    out[StaticRow.SHARE] = floats([r.share for r in reqs], n)
    out[StaticRow.GROUP_KEY] = -1
    for i in (out[StaticRow.SPEC + SloTable.CLS] == COMPOUND).nonzero()[0].tolist():
        slo = reqs[i].slo
        if slo.program_id is not None:
            out[StaticRow.GROUP_KEY, i] = groups.setdefault((slo.program_id, slo.stage), len(groups))
    return out


class DynamicRow:
    """Row layout of a request's per-pass numbers (what an engine refreshes between passes)."""

    GENERATED, CACHED, STARTED, PREDICTED, BE_TIER, ATTAINED = range(6)


DYNAMIC_ROWS = 6


def read_generated(reqs: Sequence[RequestView]) -> np.ndarray:
    return floats([r.generated for r in reqs], len(reqs))


def read_cached(reqs: Sequence[RequestView]) -> np.ndarray:
    return floats([r.prefix_cached for r in reqs], len(reqs))


def read_started(reqs: Sequence[RequestView]) -> np.ndarray:
    return bools([r.first_token_time is not None for r in reqs], len(reqs))


def read_predicted(reqs: Sequence[RequestView]) -> np.ndarray:
    nan = math.nan
    return floats([nan if (x := r.predicted_output_len) is None else x for r in reqs], len(reqs))


def read_be_tier(reqs: Sequence[RequestView]) -> np.ndarray:
    return bools([r.best_effort_tier for r in reqs], len(reqs))


def read_attained(reqs: Sequence[RequestView]) -> np.ndarray:
    return floats([r.attained_service for r in reqs], len(reqs))


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
    out[DynamicRow.GENERATED] = read_generated(reqs)
    out[DynamicRow.CACHED] = read_cached(reqs)
    out[DynamicRow.STARTED] = read_started(reqs)
    out[DynamicRow.PREDICTED] = read_predicted(reqs)
    out[DynamicRow.BE_TIER] = read_be_tier(reqs)
    out[DynamicRow.ATTAINED] = read_attained(reqs)
    return out
