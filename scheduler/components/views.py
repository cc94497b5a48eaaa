"""SGLang's waiting and running requests as the policy core's views.

Reads from each SGLang `Req`: rid, sampling_params (max_new_tokens, custom_params),
origin_input_ids, output_ids, customized_info (the token stamps), prefix_len (the cached prefix).

A pass with thousands of waiting requests must cost far less than a GPU step (~7 ms), so each
request's view is built once and kept: every pass refreshes only what can change. A waiting
request changes only when SGLang re-matches its prefix (a new `prefix_len`) or when
it comes back from a retraction with more output; a running one gains tokens every pass. Views
are therefore mutable and shared across passes: a policy must not keep one beyond its plan().

The builder also keeps every view's numbers in a RowCache as it refreshes them, and hands the
pass their rows (`EngineView.known_rows`): the plan path then reads its columns without
walking the views again (scheduler/core/columns.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Set
from dataclasses import dataclass
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np

from scheduler.components.queue_snapshot import QueueSnapshot
from scheduler.components.request_state import RequestStates, oracle_hint
from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.clock import Clock
from scheduler.core.columns import PassRows, RowCache
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.programs import ProgramTracker
from scheduler.core.types import EngineView, RequestView
from wire import TOKEN_TS_KEY


@dataclass(frozen=True)
class EngineLimits:
    """The engine-wide numbers of a view, read from SGLang each pass."""

    max_running_requests: int
    chunk_size: int  # the normal-pass prefill budget: a plan never exceeds it
    free_kv_tokens: int
    total_kv_tokens: int
    step: int
    card_busy_s: float = 0.0  # the card's launched work still to run: the pass starts after it


class ViewBuilder:
    def __init__(
        self,
        states: RequestStates,
        clock: Clock,
        compound: CompoundDeadlines,
        programs: ProgramTracker | None = None,
        lengths: LiveLengthBounds | None = None,
        decode_text: Callable[[Sequence[int]], str] = lambda ids: "",
        oracle: bool = False,
    ) -> None:
        self.states = states
        self.clock = clock
        self.compound = compound
        self.programs = programs if programs is not None else ProgramTracker()
        self.lengths = lengths
        self.decode_text = decode_text
        self.oracle = oracle  # benchmarks' *_oracle policies only: they are given the true length
        # rid -> [view, the prefix length and output length it was refreshed with,
        # whether its SLO is best effort, its row in `rows` (-1 until the pass that made it ends)]
        self._cache: dict[str, list[Any]] = {}
        self.rows = RowCache()
        self.row_slack = 4096  # rows of departed requests kept before the cache is rebuilt
        self.queue = QueueSnapshot()  # the waiting requests no pass needs to look at again
        self._batch: _RunningBatch | None = None  # the running requests as the last pass saw them
        self.cached_tokens_read = 0  # cached prefix tokens read from SGLang's requests, summed per read

    def forget(self, rid: str) -> None:
        self._cache.pop(rid, None)
        self._batch = None

    def keep_only(self, live: set[str]) -> None:
        self._cache = {rid: entry for rid, entry in self._cache.items() if rid in live}
        self._batch = None

    def views(self, reqs: Sequence[Any], pass_rows: _PassRowsBuilder | None = None) -> list[RequestView]:
        """Each request's view, refreshed where SGLang may have changed it since the last pass
        (the unchanged case costs a few lookups: at thousands waiting this loop is a visible
        share of a pass). `pass_rows` collects their rows and which views changed."""
        rows = pass_rows if pass_rows is not None else _PassRowsBuilder()
        if pass_rows is None:
            self._retier(rows)
        get = self._cache.get
        plain = self.lengths is None  # then a decode step changes a started view's count only
        entries: list[list[Any]] = []
        append = entries.append
        grown_rows, grown_counts = rows.grown
        for req in reqs:
            entry = get(req.rid)
            if entry is None:
                view = self.request_view(req)
                entry = self._cache[req.rid] = [
                    view,
                    req.prefix_len,
                    len(req.output_ids),
                    view.slo.is_best_effort,
                    -1,
                ]
                rows.new.append(entry)
            else:
                prefix, n_out = req.prefix_len, len(req.output_ids)
                if prefix == entry[1] and n_out == entry[2]:
                    pass  # unchanged: most of the waiting queue
                elif prefix == entry[1] and plain and entry[0].first_token_time is not None:
                    view = entry[0]  # a running request one step further: most of the batch
                    view.generated = entry[2] = n_out
                    view.attained_service = float(view.prompt_len + n_out)
                    if entry[4] >= 0:
                        grown_rows.append(entry[4])
                        grown_counts.append(n_out)
                else:
                    self._refresh(entry[0], req, n_out)
                    entry[1], entry[2] = prefix, n_out
                    if entry[4] >= 0:
                        rows.stale_rows.append(entry[4])
                        rows.stale_views.append(entry[0])
            append(entry)
        rows.looked_at(entries)
        if pass_rows is None:
            rows.finish(self.rows)
        return list(map(_VIEW, entries))

    def _waiting_views(self, reqs: Sequence[Any], pass_rows: _PassRowsBuilder) -> list[RequestView]:
        """`views` of the waiting queue, skipping the run the last applied order left untouched
        (QueueSnapshot): only its first request, which the admission walk may have re-matched,
        and what joined after it are looked at."""
        run = self.queue.unchanged(reqs)
        if run is None:
            return self.views(reqs, pass_rows)
        head = self.views(reqs[:1], pass_rows)
        pass_rows.known(run.rows)
        return head + self.rows.views_at(run.rows) + self.views(reqs[run.stop :], pass_rows)

    def _running_views(self, reqs: Sequence[Any], pass_rows: _PassRowsBuilder) -> list[RequestView]:
        """`views` of the running batch. A decode pass leaves SGLang's batch as it was (the same
        requests, in order, each with its prefix) but one token longer: then only the output
        counts are read, in one C loop, and the views that grew are updated (at 256 running
        this was a fifth of a pass)."""
        batch = self._batch
        if batch is not None and batch.holds(reqs):
            counts = np.fromiter(map(len, map(_OUTPUT_IDS, reqs)), dtype=np.int64, count=len(reqs))
            grew = (counts != batch.counts).nonzero()[0]
            if grew.size and batch.unstarted[grew].any():  # a first token: its view reads its stamp
                return self._batch_views(reqs, pass_rows)
            if grew.size:
                grown = counts[grew]
                attained = (batch.prompt_lens[grew] + grown).astype(float).tolist()  # exact: whole numbers
                entries = batch.entries if grew.size == len(counts) else list(map(batch.entries.__getitem__, grew))
                for entry, n, service in zip(entries, grown.tolist(), attained, strict=True):
                    view = entry[0]
                    view.generated = entry[2] = n
                    view.attained_service = service
                pass_rows.grew(batch.rows[grew], grown)
                batch.counts = counts
            pass_rows.known(batch.rows)
            return batch.views
        return self._batch_views(reqs, pass_rows)

    def _batch_views(self, reqs: Sequence[Any], pass_rows: _PassRowsBuilder) -> list[RequestView]:
        """`views` of a running batch not seen as it is, kept for the passes that find it
        unchanged but for its output counts. A request still prefilling (no token yet) keeps
        its count until its first token, which ends the batch's fast path for one pass."""
        self._batch = None
        views = self.views(reqs, pass_rows)
        if self.lengths is None:
            # every later pass that finds the batch unchanged is a decode step: counts only
            self._batch = _RunningBatch(reqs, views, [self._cache[req.rid] for req in reqs])
        return views

    def waiting_rids(self, queue: Sequence[Any]) -> list[str] | None:
        """The rids of `queue`, which the last `engine_view` saw as it is (None: not kept, or
        not this queue)."""
        return self.queue.viewed_rids(queue, self.rows.rid_array)

    def held_to_tail(
        self, rids: Set[str], at: np.ndarray | None = None, kept: list[Any] | None = None, held: list[Any] | None = None
    ) -> None:
        """SGLang's admission walk runs with these waiting requests set aside; they rejoin the
        queue's tail after it (QueueSnapshot.to_tail: `at` their positions in the applied
        queue, `kept` and `held` the two parts set_aside made of it)."""
        self.queue.to_tail(rids, self.rows.rid_array, at, kept, held)

    def _retier(self, rows: _PassRowsBuilder) -> None:
        """The views whose tier the last plan changed (RequestStates tracks them): a view's
        tier is its SLO's best effort or the states' declined set."""
        declined = self.states.declined
        for rid in self.states.take_tier_changes():
            entry = self._cache.get(rid)
            if entry is None:
                continue  # not seen yet: its view will read the tier when made
            view, tier = entry[0], entry[3] or rid in declined
            if tier is not view.best_effort_tier:
                view.best_effort_tier = tier
                if entry[4] >= 0:
                    rows.retiered[0].append(entry[4])
                    rows.retiered[1].append(tier)

    def _refresh(self, view: RequestView, req: Any, n_out: int) -> None:
        view.generated = n_out
        view.attained_service = float(view.prompt_len + n_out)
        view.prefix_cached = req.prefix_len
        self.cached_tokens_read += view.prefix_cached
        if view.first_token_time is None:
            stamps = (req.customized_info or {}).get(TOKEN_TS_KEY) or []
            view.first_token_time = stamps[0] if stamps else None
        if self.lengths is not None:
            view.predicted_output_len = self._bound(req, view)

    def _bound(self, req: Any, view: RequestView) -> float | None:
        assert self.lengths is not None
        return self.lengths.bound(
            req.rid,
            lambda: self.decode_text(req.origin_input_ids),
            len(req.origin_input_ids),
            view.slo.program_id,
            len(req.output_ids),
            lambda n: self.decode_text(req.output_ids[:n]),
        )

    def request_view(self, req: Any) -> RequestView:
        state = self.states.of(req, self.clock.now())
        spec, arrival = state.slo, state.arrival
        stamps = (req.customized_info or {}).get(TOKEN_TS_KEY) or []
        program_arrival = stage_deadline = None
        if spec.program_id is not None:
            program_arrival = self.programs.arrival(spec.program_id, arrival)
            if spec.deadline_ms is not None:
                if not state.stage_deadline_known:  # D_s = φ(s)·D, fixed when the stage is first seen
                    state.stage_deadline = self.compound.stage_deadline(
                        spec.program_id, spec.stage, program_arrival, spec.deadline_ms / 1000.0, self.clock.now()
                    )
                stage_deadline = state.stage_deadline
        view = RequestView(
            rid=req.rid,
            slo=spec,
            arrival=arrival,
            prompt_len=len(req.origin_input_ids),
            generated=len(req.output_ids),
            max_new_tokens=state.client_cap if state.hinted else req.sampling_params.max_new_tokens,
            first_token_time=stamps[0] if stamps else None,
            prefix_cached=req.prefix_len,
            program_arrival=program_arrival,
            attained_service=float(len(req.origin_input_ids) + len(req.output_ids)),
            stage_deadline=stage_deadline,
            best_effort_tier=spec.is_best_effort or self.states.is_declined(req.rid),
            oracle_output_len=oracle_hint(req.sampling_params) if self.oracle else None,
            tenant=state.tenant,
            share=state.share,
        )
        if self.lengths is not None:
            view.predicted_output_len = self._bound(req, view)
        self.cached_tokens_read += view.prefix_cached
        return view

    def engine_view(self, waiting: Sequence[Any], running: Sequence[Any], limits: EngineLimits) -> EngineView:
        if len(self.rows) > 2 * len(self._cache) + self.row_slack:
            self._rebuild_rows()
        pass_rows = _PassRowsBuilder()
        self._retier(pass_rows)
        waiting_views = self._waiting_views(waiting, pass_rows)
        running_views = self._running_views(running, pass_rows)
        rows = pass_rows.finish(self.rows)
        self.queue.viewed(rows[: len(waiting_views)])
        return EngineView(
            now=self.clock.now() + limits.card_busy_s,  # when this pass runs, not when it is planned
            waiting=waiting_views,
            running=running_views,
            max_running_requests=limits.max_running_requests,
            chunk_size=limits.chunk_size,
            free_kv_tokens=limits.free_kv_tokens,
            total_kv_tokens=limits.total_kv_tokens,
            step=limits.step,
            known_rows=PassRows(self.rows, rows, waiting_views, running_views),
        )

    def _rebuild_rows(self) -> None:
        """A fresh RowCache holding only the live views: rows of departed requests are dropped."""
        entries = list(self._cache.values())
        self.rows = RowCache()
        self.queue.forget()  # its rows are renumbered
        self._batch = None
        for entry, row in zip(entries, self.rows.append([e[0] for e in entries]).tolist(), strict=True):
            entry[4] = row


_VIEW, _ROW = itemgetter(0), itemgetter(4)  # of a builder's entry
_OUTPUT_IDS, _PREFIX = attrgetter("output_ids"), attrgetter("prefix_len")  # of a SGLang Req


class _RunningBatch:
    """The running requests a pass saw, every one started: their builder entries, rows, prefix
    lengths and output counts, to tell the next pass whether only counts changed."""

    def __init__(self, reqs: Sequence[Any], views: list[RequestView], entries: list[list[Any]]) -> None:
        self.reqs, self.views, self.entries = list(reqs), views, entries
        self.prefixes = list(map(_PREFIX, reqs))
        self.counts = np.fromiter(map(itemgetter(2), entries), dtype=np.int64, count=len(entries))
        self.prompt_lens = np.fromiter((v.prompt_len for v in views), dtype=np.int64, count=len(views))
        self.unstarted = np.fromiter((v.first_token_time is None for v in views), dtype=bool, count=len(views))
        self._rows: np.ndarray | None = None

    @property
    def rows(self) -> np.ndarray:
        """Read on first use: entries new in the pass that made the batch get rows as it ends."""
        if self._rows is None:
            self._rows = np.fromiter(map(_ROW, self.entries), dtype=np.int64, count=len(self.entries))
        return self._rows

    def holds(self, reqs: Sequence[Any]) -> bool:
        """These are the same requests, in order, none re-matched since."""
        return (
            len(reqs) == len(self.reqs) and all(map(is_, reqs, self.reqs)) and list(map(_PREFIX, reqs)) == self.prefixes
        )


class _PassRowsBuilder:
    """One pass's rows as the view loop finds them: views new this pass get theirs at the end,
    in one read; views that changed are read again; runs of views the loop skipped come with
    their rows."""

    def __init__(self) -> None:
        self.parts: list[list[list[Any]] | np.ndarray] = []  # entries looked at, or known rows, in order
        self.new: list[list[Any]] = []  # entries made this pass (no row yet)
        self.stale_rows: list[int] = []
        self.stale_views: list[RequestView] = []
        self.grown: tuple[list[int], list[int]] = ([], [])  # rows whose output count alone changed, the count
        self.retiered: tuple[list[int], list[bool]] = ([], [])  # rows whose tier alone changed, the tier
        self.grown_blocks: list[tuple[np.ndarray, np.ndarray]] = []  # more of them, as arrays

    def grew(self, rows: np.ndarray, counts: np.ndarray) -> None:
        self.grown_blocks.append((rows, counts))

    def looked_at(self, entries: list[list[Any]]) -> None:
        self.parts.append(entries)

    def known(self, rows: np.ndarray) -> None:
        self.parts.append(rows)

    def finish(self, cache: RowCache) -> np.ndarray:
        cache.rewrite(self.stale_rows, self.stale_views)
        if self.retiered[0]:
            cache.set_tier(*self.retiered)
        if self.grown[0]:
            cache.set_generated(*self.grown)
        for rows, counts in self.grown_blocks:
            cache.set_generated(rows, counts)
        if self.new:
            for entry, row in zip(self.new, cache.append([e[0] for e in self.new]).tolist(), strict=True):
                entry[4] = row
        parts = [
            part if isinstance(part, np.ndarray) else np.fromiter(map(_ROW, part), dtype=np.int64, count=len(part))
            for part in self.parts
        ]
        return np.concatenate(parts) if len(parts) != 1 else parts[0]
