"""Requests as the arrays a vectorised policy scores (Tempo, GMAX): `ViewColumns` plus the
policy's own output-length default. Per-request Python work happens in columns.py, once per
pass; everything here is numpy arithmetic on what it read."""

from __future__ import annotations

from collections.abc import Sequence, Set

import numpy as np

from scheduler.core.columns import ViewColumns
from scheduler.core.packing import floats
from scheduler.core.position_rids import PositionRids
from scheduler.core.row_reads import SloTable
from scheduler.core.types import RequestView


class ReqArrays:
    """Column view of requests (waiting first, then running) for vectorised scoring.

    Fields: arrival; base (`deadline_bases`: program arrival for compound stages, else
    arrival; read only where a deadline exists, arrival elsewhere); prompt; generated; cached;
    started (bool); running (bool); weight; cls (int class codes above); deadline
    (`absolute_deadlines`: end-to-end or stage deadline, nan if none); ttft_s (nan if none);
    tpot_s (0 if none); total_out (`output_bounds`: upper-bound total output length,
    >= generated + 1); group (compound (program, stage) group index, -1 otherwise: only the
    partition is meaningful, not the numbering); max_queue_s (nan if none); and, read on first
    use, attained and be_tier (bool)."""

    def __init__(
        self,
        rids: list[str] | None,
        n_waiting: int,
        reqs: list[RequestView],
        arrival: np.ndarray,
        base: np.ndarray,
        prompt: np.ndarray,
        generated: np.ndarray,
        cached: np.ndarray,
        started: np.ndarray,
        running: np.ndarray,
        weight: np.ndarray,
        cls: np.ndarray,
        deadline: np.ndarray,
        ttft_s: np.ndarray,
        tpot_s: np.ndarray,
        total_out: np.ndarray,
        group: np.ndarray,
        max_queue_s: np.ndarray,
    ) -> None:
        self._rids = rids  # None: read from _rid_array on first use
        self.n_waiting = n_waiting
        self.reqs = reqs
        self.arrival = arrival
        self.base = base
        self.prompt = prompt
        self.generated = generated
        self.cached = cached
        self.started = started
        self.running = running
        self.weight = weight
        self.cls = cls
        self.deadline = deadline
        self.ttft_s = ttft_s
        self.tpot_s = tpot_s
        self.total_out = total_out
        self.group = group
        self.max_queue_s = max_queue_s
        self._attained: np.ndarray | None = None
        self._be_tier: np.ndarray | None = None
        self._end_to_end: np.ndarray | None = None
        self._columns: ViewColumns | None = None  # where attained and be_tier are read, if given
        self._rid_array: np.ndarray | None = None  # rids as an object array, if given

    @property
    def n(self) -> int:
        return len(self.arrival)

    @property
    def rids(self) -> list[str]:
        if self._rids is None:
            assert self._rid_array is not None
            self._rids = self._rid_array.tolist()
        return self._rids

    @property
    def end_to_end_deadline(self) -> np.ndarray:
        """`deadline`, but a compound stage's program deadline rather than its sub-deadline."""
        if self._end_to_end is None:
            assert self._columns is not None, "taken arrays carry it from their source"
            self._end_to_end = self._columns.end_to_end_deadline
        return self._end_to_end

    @property
    def attained(self) -> np.ndarray:
        if self._attained is None:
            c = self._columns
            self._attained = c.attained if c is not None else floats([r.attained_service for r in self.reqs], self.n)
        return self._attained

    @property
    def be_tier(self) -> np.ndarray:
        if self._be_tier is None:
            c = self._columns
            self._be_tier = (
                c.be_tier
                if c is not None
                else np.fromiter((r.best_effort_tier for r in self.reqs), dtype=bool, count=self.n)
            )
        return self._be_tier

    def rids_at(self, idx: np.ndarray) -> list[str]:
        """The rids at these positions, in that order."""
        if self._rid_array is not None:
            return self._rid_array[idx].tolist()
        rids = self.rids
        return [rids[i] for i in idx.tolist()]

    def rid_set_at(self, idx: np.ndarray) -> Set[str]:
        """The rids at these positions as a set, hashed only when asked by rid (PositionRids)."""
        if self._rid_array is not None:
            return PositionRids(self._rid_array, idx)
        return frozenset(self.rids_at(idx))

    def take(self, idx: np.ndarray, n_waiting: int) -> ReqArrays:
        """The rows at `idx` (the first n_waiting of them waiting), e.g. without dropped ones."""
        pos = idx.tolist()
        rids, reqs = self.rids, self.reqs
        out = ReqArrays(
            [rids[i] for i in pos],
            n_waiting,
            [reqs[i] for i in pos],
            *(
                getattr(self, f)[idx]
                for f in (
                    "arrival",
                    "base",
                    "prompt",
                    "generated",
                    "cached",
                    "started",
                    "running",
                    "weight",
                    "cls",
                    "deadline",
                    "ttft_s",
                    "tpot_s",
                    "total_out",
                    "group",
                    "max_queue_s",
                )
            ),
        )
        if self._attained is not None:
            out._attained = self._attained[idx]
        if self._be_tier is not None:
            out._be_tier = self._be_tier[idx]
        if self._end_to_end is not None or self._columns is not None:
            out._end_to_end = self.end_to_end_deadline[idx]
        if self._rid_array is not None:
            out._rid_array = self._rid_array[idx]
        return out

    @classmethod
    def from_columns(cls, c: ViewColumns, default_output_len: float) -> ReqArrays:
        """The columns' arrays (shared, not copied: a policy must not write into them)."""
        out = cls(
            rids=c.__dict__.get("rids"),  # the list if the pass made it, else made when asked for
            n_waiting=c.n_waiting,
            reqs=c.reqs,
            arrival=c.arrival,
            base=c.base,
            prompt=c.prompt,
            generated=c.generated,
            cached=c.cached,
            started=c.started,
            running=c.running,
            weight=c.weight,
            cls=c.cls,
            deadline=c.deadline,
            ttft_s=c.ttft_s,
            tpot_s=c.tpot_s,
            total_out=c.total_out(default_output_len),
            group=c.group,
            max_queue_s=c.max_queue_s,
        )
        out._columns, out._rid_array = c, c.rid_array
        return out

    @classmethod
    def from_views(
        cls,
        waiting: Sequence[RequestView],
        running: Sequence[RequestView],
        default_output_len: float,
        slo_table: SloTable | None = None,
    ) -> ReqArrays:
        """These views read now; SLO numbers come from `slo_table` (pass a long-lived one to
        read each spec once across steps)."""
        return cls.from_columns(ViewColumns.read(waiting, running, None, slo_table), default_output_len)
