"""SGLang's waiting and running requests as the policy core's views.

Reads from each SGLang `Req`: rid, sampling_params (max_new_tokens, custom_params),
origin_input_ids, output_ids, customized_info (the token stamps), prefix_indices.

A pass with thousands of waiting requests must cost far less than a GPU step (~7 ms), so each
request's view is built once and kept: every pass refreshes only what can change. A waiting
request changes only when SGLang re-matches its prefix (a new `prefix_indices` object) or when
it comes back from a retraction with more output; a running one gains tokens every pass. Views
are therefore mutable and shared across passes: a policy must not keep one beyond its plan().
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.components.request_state import RequestStates, oracle_hint
from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.clock import Clock
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
        # rid -> [view, the prefix_indices object and output length it was refreshed with,
        # whether its SLO is best effort]
        self._cache: dict[str, list[Any]] = {}

    def forget(self, rid: str) -> None:
        self._cache.pop(rid, None)

    def keep_only(self, live: set[str]) -> None:
        self._cache = {rid: entry for rid, entry in self._cache.items() if rid in live}

    def cached_view(self, req: Any) -> RequestView:
        """The request's view, refreshed where SGLang may have changed it since the last pass."""
        entry = self._cache.get(req.rid)
        if entry is None:
            view = self.request_view(req)
            self._cache[req.rid] = [view, req.prefix_indices, len(req.output_ids), view.slo.is_best_effort]
            return view
        view = entry[0]
        prefix, n_out = req.prefix_indices, len(req.output_ids)
        if prefix is not entry[1] or n_out != entry[2]:
            self._refresh(view, req, n_out)
            entry[1], entry[2] = prefix, n_out
        view.best_effort_tier = entry[3] or req.rid in self.states.declined
        return view

    def views(self, reqs: Sequence[Any]) -> list[RequestView]:
        """`cached_view` of each request, with the unchanged case inlined: at thousands waiting
        this loop is a visible share of a pass."""
        get = self._cache.get
        declined = self.states.declined
        out: list[RequestView] = []
        append = out.append
        for req in reqs:
            rid = req.rid
            entry = get(rid)
            if entry is None or req.prefix_indices is not entry[1] or len(req.output_ids) != entry[2]:
                append(self.cached_view(req))
                continue
            view = entry[0]
            view.best_effort_tier = entry[3] or rid in declined
            append(view)
        return out

    def _refresh(self, view: RequestView, req: Any, n_out: int) -> None:
        view.generated = n_out
        view.attained_service = float(len(req.origin_input_ids) + n_out)
        prefix = getattr(req, "prefix_indices", None)
        view.prefix_cached = len(prefix) if prefix is not None else 0
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
        prefix = getattr(req, "prefix_indices", None)
        view = RequestView(
            rid=req.rid,
            slo=spec,
            arrival=arrival,
            prompt_len=len(req.origin_input_ids),
            generated=len(req.output_ids),
            max_new_tokens=state.client_cap if state.hinted else req.sampling_params.max_new_tokens,
            first_token_time=stamps[0] if stamps else None,
            prefix_cached=len(prefix) if prefix is not None else 0,
            program_arrival=program_arrival,
            attained_service=float(len(req.origin_input_ids) + len(req.output_ids)),
            stage_deadline=stage_deadline,
            best_effort_tier=spec.is_best_effort or self.states.is_declined(req.rid),
            oracle_output_len=oracle_hint(req.sampling_params) if self.oracle else None,
        )
        if self.lengths is not None:
            view.predicted_output_len = self._bound(req, view)
        return view

    def engine_view(self, waiting: Sequence[Any], running: Sequence[Any], limits: EngineLimits) -> EngineView:
        return EngineView(
            now=self.clock.now() + limits.card_busy_s,  # when this pass runs, not when it is planned
            waiting=self.views(waiting),
            running=self.views(running),
            max_running_requests=limits.max_running_requests,
            chunk_size=limits.chunk_size,
            free_kv_tokens=limits.free_kv_tokens,
            total_kv_tokens=limits.total_kv_tokens,
            step=limits.step,
        )
