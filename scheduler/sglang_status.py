"""The scheduler's status for /slo/status, /metrics and the router, published by each
data-parallel replica's leading rank. A mixin of `SloSchedulerMixin`."""

from __future__ import annotations

from typing import Any

from scheduler import sglang_emulated_forward as emulated_forward
from scheduler.components.assembly import SloComponents
from scheduler.components.status import SchedulerStatus
from scheduler.components.status_channel import StatusPublisher, dp_status_address
from scheduler.core.plan_path import DECODE, MIXED
from scheduler.sglang_engine import disagg_role, dp_index, pipeline_rank, running_requests
from scheduler.sglang_speculation import draft_model_runner


class SloStatusMixin:
    slo: SloComponents

    def _slo_start_status(self) -> None:
        """One publisher per data-parallel replica (its leading rank), each on its own address."""
        if self.slo.config.status_address and self.slo.sync.leader and pipeline_rank() == 0:
            self.slo_status = StatusPublisher(
                dp_status_address(self.slo.config.status_address, dp_index()),
                self.slo_status_snapshot,
                self.slo.config.status_interval_s,
            )

    def _slo_kv_used_tokens(self) -> int | None:
        """KV tokens held by requests (cached prefixes that could be evicted count as free)."""
        try:
            free = self._slo_free_kv_tokens()
        except Exception:  # noqa: BLE001 - read from the status thread; never break the status
            return None
        return max(0, int(self.max_total_num_tokens - free))  # type: ignore[attr-defined]

    def _slo_stand_in_forward(self) -> bool:
        """Whether every model a step runs (the target, and the draft under speculation) skips
        its layers: a step that runs one in full costs the host more than a paced step may."""
        target = self.tp_worker.model_runner.model  # type: ignore[attr-defined]
        draft_worker = self.draft_worker  # type: ignore[attr-defined]
        draft = draft_model_runner(draft_worker) if draft_worker is not None else None
        return emulated_forward.is_installed(target) and (draft is None or emulated_forward.is_installed(draft.model))

    def _slo_speculation_status(self) -> dict[str, Any] | None:
        if self.draft_worker is None:  # type: ignore[attr-defined]
            return None
        base = {
            "algorithm": str(self.server_args.speculative_algorithm),  # type: ignore[attr-defined]
            "draft_cost_ratio": round(self.slo.meter.spec_cost_ratio, 4),
        }
        if self.slo.spec is None:  # SGLang's fixed length (or its own adaptive params)
            return {**base, "slo_adaptive": False, "steps": self._slo_spec_steps()}
        return {**base, "slo_adaptive": True, **self.slo.spec.status()}

    def slo_status_snapshot(self) -> dict[str, Any]:
        slo = self.slo
        started, current, counters = slo.started, slo.pass_state, slo.counters
        applied = current.applied
        engine: Any = self
        role = disagg_role(self)
        return SchedulerStatus(
            policy=slo.config.policy,
            waiting=len(engine.waiting_queue),
            running=running_requests(self),
            max_running_requests=started.max_running,
            disaggregation_mode=role if role != MIXED else "null",
            chunked_prefill_size=engine.chunked_prefill_size,
            steps=current.step,
            kv_capacity_tokens=int(engine.max_total_num_tokens),
            kv_used_tokens=self._slo_kv_used_tokens(),
            prefill_ms_per_token=slo.meter.prefill_ms_per_token(),
            dropped_in_queue=counters.dropped,
            prefill_deferred=counters.prefill_deferred,
            prefill_alone=counters.prefill_alone,
            batch_cap=applied.batch_cap,
            prefill_tokens=applied.prefill_tokens,
            startup_chunk_size=started.startup_chunk,
            chunk_budget=started.chunk_budget,
            dynamic_chunking=None if slo.chunker is None else slo.chunker.status(),
            decode_cap=applied.decode_cap if role == DECODE else None,
            mixed_batching=bool(engine.is_mixed_chunk),
            best_effort_waiting=counters.best_effort_waiting,
            held_waiting=counters.held_waiting,
            lost_held_passes=counters.lost_held_passes,
            perf_model=slo.meter.perf_status(),
            predictor_accuracy=slo.accuracy.summary(),
            compound={
                "open_programs": len(slo.compound),
                "patterns": len(slo.compound.library),
                "stage_deadlines_matched": slo.compound.matched,
            },
            plan_errors=slo.planner.errors + slo.sync.failed,
            fallbacks=slo.planner.fallbacks + slo.sync.failed,
            planned_passes=counters.planned_passes,
            budget_fallbacks=slo.planner.budget_fallbacks,
            view_cached_prefix_tokens=slo.views.cached_tokens_read,
            queue_drain_s=None if current.drain_s is None else round(current.drain_s, 4),
            decode_step_ms=slo.meter.decode_step_ms(running_requests(self), self._slo_kv_used_tokens() or 0),
            slo_levers=slo.planner.settings.levers,
            shed=dict(counters.shed),
            intake_lag=counters.intake.summary(),
            max_queued_requests=engine.max_queued_requests,
            max_queued_tokens=slo.config.max_queued_tokens,
            max_input_tokens=getattr(self, "max_req_input_len", None),
            preempted=counters.preempted,
            emulation=None
            if slo.meter.pacer is None
            else slo.emulation_status(int(engine.max_total_num_tokens), self._slo_stand_in_forward()),
            speculation=self._slo_speculation_status(),
            length_predictor=None
            if slo.lengths is None
            else {
                "name": slo.lengths.predictor.name,
                "predictions": slo.lengths.predictions,
                **({"bound": slo.lengths.predictor.chosen()} if hasattr(slo.lengths.predictor, "chosen") else {}),
            },
        ).to_dict()
