"""SGLang's waiting and running requests as the policy core's views.

Reads from each SGLang `Req`: rid, sampling_params (max_new_tokens, custom_params),
origin_input_ids, output_ids, customized_info (the token stamps), prefix_indices.
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
        predicted = None
        if self.lengths is not None:
            predicted = self.lengths.bound(
                req.rid,
                lambda: self.decode_text(req.origin_input_ids),
                len(req.origin_input_ids),
                spec.program_id,
                len(req.output_ids),
                lambda n: self.decode_text(req.output_ids[:n]),
            )
        prefix = getattr(req, "prefix_indices", None)
        return RequestView(
            rid=req.rid,
            slo=spec,
            arrival=arrival,
            prompt_len=len(req.origin_input_ids),
            generated=len(req.output_ids),
            max_new_tokens=state.client_cap if state.hinted else req.sampling_params.max_new_tokens,
            predicted_output_len=predicted,
            first_token_time=stamps[0] if stamps else None,
            prefix_cached=len(prefix) if prefix is not None else 0,
            program_arrival=program_arrival,
            attained_service=float(len(req.origin_input_ids) + len(req.output_ids)),
            stage_deadline=stage_deadline,
            best_effort_tier=spec.is_best_effort or state.declined,
            oracle_output_len=oracle_hint(req.sampling_params) if self.oracle else None,
        )

    def engine_view(self, waiting: Sequence[Any], running: Sequence[Any], limits: EngineLimits) -> EngineView:
        return EngineView(
            now=self.clock.now(),
            waiting=[self.request_view(r) for r in waiting],
            running=[self.request_view(r) for r in running],
            max_running_requests=limits.max_running_requests,
            chunk_size=limits.chunk_size,
            free_kv_tokens=limits.free_kv_tokens,
            total_kv_tokens=limits.total_kv_tokens,
            step=limits.step,
        )
