"""The adapter: puts the policy core in charge of SGLang's scheduler.

`SloScheduler` subclasses SGLang's Scheduler inside the spawned scheduler process. It is a thin
set of overrides: each pass it asks its components (scheduler/components/) for the core's view
and a finished plan, and turns the plan into SGLang calls. Every override below names the SGLang
behaviour it changes. Plan semantics live in scheduler/core/plan_path.py, shared with the
simulator; no attribute is ever written on SGLang's request objects.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from sglang.srt.managers import scheduler as sglang_scheduler_module
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.scheduler import NextBatchPlan

from scheduler import sglang_emulated_forward as emulated_forward
from scheduler.components.assembly import SloComponents, build_components
from scheduler.components.meter import batch_shape
from scheduler.components.plan_applier import order_waiting
from scheduler.components.rank_sync import PassDecision
from scheduler.components.request_state import injected_arrival
from scheduler.components.token_stamps import stamping_streamer_class
from scheduler.config import SloServerConfig
from scheduler.core.compound import EXPIRE_EVERY_STEPS
from scheduler.core.plan_path import PREFILL, settings_for
from scheduler.core.types import EngineView
from scheduler.sglang_engine import cuda_step_timer, disagg_role, pass_sync
from scheduler.sglang_plan import SloPlanMixin
from scheduler.sglang_preemption import retract_requests
from scheduler.sglang_queue import SloQueueMixin
from scheduler.sglang_speculation import attach_slo_controller, draft_model_runner, measured_draft_ratio
from scheduler.sglang_status import SloStatusMixin

logger = logging.getLogger("sglang_slo.scheduler")

DRAIN_REFRESH_S = 0.1  # how often the published queue drain estimate is recomputed

_BaseScheduler = sglang_scheduler_module.Scheduler


def capped_adder_class(base: type, limit_of: Any) -> type:
    """SGLang's PrefillAdder admitting at most `limit_of(running requests)` requests this pass
    (None: no limit of ours), through its own per-pass request bound (`prefill_max_requests`)."""

    class SloPrefillAdder(base):  # type: ignore[valid-type, misc]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            limit = limit_of(len(self.running_batch.reqs))
            if limit is not None:
                bound = self.prefill_max_requests
                self.prefill_max_requests = max(0, limit) if bound is None else min(bound, max(0, limit))

    return SloPrefillAdder


# SGLang's EAGLE-family workers (STANDALONE included) feed the draft the sequence shifted by one,
# EAGLE's layout: the token at the target's position i+1 sits at the draft's position i. A real
# draft's rotary positions are relative and do not see it; the stand-in's absolute ones do.
EAGLE_DRAFT_POSITION_LAG = 1


class SloSchedulerMixin(SloPlanMixin, SloQueueMixin, SloStatusMixin):
    """The SLO overrides of SGLang's Scheduler: a policy decides order, admission, batch cap and
    chunk. A mixin so that tests can put it over a stand-in engine instead of SGLang's. Plan
    application, queue accounting and status publishing are its mixins' jobs."""

    slo: SloComponents

    def __init__(self, *args: Any, slo_components: SloComponents | None = None, **kwargs: Any) -> None:
        # SGLang's init already calls some of these overrides: the components come first
        self.slo = slo_components if slo_components is not None else build_components(SloServerConfig.from_env())
        super().__init__(*args, **kwargs)
        if self.slo.config.emulate_stand_in:  # emulated steps: logits only, the layers skipped
            emulated_forward.install(self.tp_worker.model_runner)
            draft = draft_model_runner(self.draft_worker) if self.draft_worker is not None else None
            if draft is not None:  # the draft too: each draft pass would otherwise run its layers
                emulated_forward.install_draft(
                    draft,
                    self.tp_worker.model_runner,
                    self.slo.config.emulate_draft_acceptance,
                    position_offset=EAGLE_DRAFT_POSITION_LAG,
                )
        if self.slo.spec is not None:
            # SGLang's resolved mixed batching (set after the draft worker is built; its server
            # args keep the operator's input): under EAGLE's mixed steps drafts run only in
            # decode-only steps, which the controller's rule depends on
            self.slo.spec.decode_only_drafts = bool(self.is_mixed_chunk)
        self._slo_bind_engine()
        self.slo.sync = pass_sync(self)
        self._slo_start_status()
        logger.info("SLO scheduler active: policy=%s", self.slo.config.policy)

    def _slo_bind_engine(self) -> None:
        """What the engine started with: the plan's settings, the chunk limits, the timing mode."""
        slo = self.slo
        if slo.levers_on and getattr(self, "prefill_decode_interval", 0):
            # SGLang's interval skips get_new_batch_prefill, where each pass is planned: refused
            raise ValueError("--prefill-decode-interval cannot be combined with an SLO policy (fcfs only)")
        slo.started.startup_chunk = self.chunked_prefill_size
        slo.started.max_running = self.max_running_requests
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is not None:  # a text-reading length predictor sees prompts and outputs as text
            slo.views.decode_text = tokenizer.decode
        # The view builder skips waiting requests SGLang cannot have touched since the last pass:
        # only true while SGLang's own policy neither re-sorts nor re-matches the whole queue.
        slo.views.queue.enabled = not (
            getattr(self, "enable_priority_scheduling", False)
            or getattr(self.tree_cache, "supports_fast_match_prefix", lambda: False)()
        )
        role = disagg_role(self)
        slo.planner.settings = settings_for(
            slo.planner.policy,
            mixed_batching=bool(self.is_mixed_chunk),
            role=role,
            tenant_fairness=slo.config.tenant_fairness,
        )
        slo.started.chunk_budget = self.chunked_prefill_size
        if role == PREFILL and slo.levers_on and self.chunked_prefill_size:
            # PD prefill: PolyServe dynamic chunking; the launcher started SGLang at 2B so that a
            # whole-finish step fits the buffers sized at start-up, and normal passes run at B.
            slo.start_dynamic_chunking(self.chunked_prefill_size, self.page_size)
            self.chunked_prefill_size = slo.started.chunk_budget
        # On a GPU run_batch returns once the forward is launched (with or without overlap
        # scheduling): its wall time is not the pass's, CUDA events on the forward's stream are.
        slo.meter.timing_ok = self.device == "cpu"
        if str(self.device).startswith("cuda"):
            slo.meter.gpu_timer = cuda_step_timer(self)
        elif not slo.meter.timing_ok and not slo.config.perf_profile:
            logger.warning(
                "forward passes on %s cannot be timed: batch caps and chunk sizes need --slo-perf-profile",
                self.device,
            )

    # ---- SGLang's request intake and output streaming ------------------------------------------
    def process_input_requests(self, recv_reqs: Any) -> Any:
        """Changes: marks the loop iteration's socket read, which tells the intake lag's engine
        part (waiting for this read) from host transit (missing the read before). No hook
        serves: SGLang offers none at the socket read."""
        self.slo.counters.intake.loop(time.time())
        return super().process_input_requests(recv_reqs)

    def handle_generate_request(self, recv_req: Any, **kwargs: Any) -> Any:
        """Changes: a benchmark's hidden true length ends the request there, like the model's EOS
        would (the tiny model and an emulated card have no meaningful EOS); policies keep seeing
        the client's own cap. Records how late the request reached the scheduler. No hook
        serves: the cap must be lowered before SGLang builds the Req from the sampling params."""
        self.slo.counters.intake.record(injected_arrival(recv_req.sampling_params), time.time())
        self.slo.states.lower_cap_to_hint(recv_req.rid, recv_req.sampling_params)
        return super().handle_generate_request(recv_req, **kwargs)

    def get_output_streamer_class(self) -> type:
        """Hook: each output token is stamped with the time it leaves the scheduler. The stamps
        ride in Req.customized_info, which SGLang slices per token; its own hook for added info
        (build_additional_customized_info) runs after that slicing, so stream_output stamps first."""
        return stamping_streamer_class(super().get_output_streamer_class(), self.slo.states.is_declined)

    def get_prefill_adder_class(self) -> type:
        """Hook: SGLang's admission stops at the plan's batch cap, and at one request in a PD
        whole-finish pass."""
        if getattr(self, "_slo_adder", None) is None:
            self._slo_adder = capped_adder_class(super().get_prefill_adder_class(), self._slo_admission_limit)
        return self._slo_adder

    # ---- SGLang's prefill admission -----------------------------------------------------------
    def get_new_batch_prefill(self, running_batch: Any) -> Any:
        """Changes: before SGLang's admission (normal and PD prefill workers), the waiting queue
        is dropped, ordered and tiered by this pass's plan, and the batch cap and chunk set; a
        plan that defers prefill makes this pass a decode pass. No hook serves: the adder class
        sees one pass's admission walk, not the queue's order, drops and the chunk size."""
        slo = self.slo
        current = slo.pass_state
        current.begin()  # a plan's preemptions and hold are its own pass's; its levers carry over
        decision = slo.sync.decide(lambda: self._slo_decide(running_batch), PassDecision())
        if decision.plan is not None:
            self._slo_apply(decision.plan, running_batch)
        if decision.spec_steps is not None and slo.spec is not None:
            slo.spec.current = decision.spec_steps  # the leading rank's choice (its own on that rank)
        if self.waiting_queue and time.monotonic() - current.drain_at > DRAIN_REFRESH_S:
            self._slo_queue_drain_s()  # what /slo/status and the router's Retry-After read
        elif not self.waiting_queue and current.drain_s:
            current.drain_s = 0.0
        admit = lambda: super(SloSchedulerMixin, self).get_new_batch_prefill(running_batch)  # noqa: E731
        if slo.chunker is not None:
            return self._slo_admit(lambda: self._prefill_dynamic_chunk(running_batch, admit))
        if not current.applied.prefill_open and running_batch.reqs:
            # no prefill fits the running requests' slack this pass: SGLang decodes instead
            slo.counters.prefill_deferred += 1
            return NextBatchPlan(batch_to_run=None, running_batch=running_batch)
        if current.applied.prefill_alone and running_batch.reqs:
            return self._slo_prefill_alone(admit)
        return self._slo_admit(admit)

    def _slo_prefill_alone(self, admit: Callable[[], Any]) -> Any:
        """This pass's prefill without the decodes (the plan's `prefill_alone`): SGLang's admission
        runs as with mixing off (no decode rows charged to the budget, none mixed into the
        batch), so the running batch decodes in the next pass. No hook serves: SGLang reads
        `is_mixed_chunk` inside this call."""
        mixed, self.is_mixed_chunk = self.is_mixed_chunk, False
        try:
            batch = self._slo_admit(admit)
        finally:
            self.is_mixed_chunk = mixed
        if getattr(batch, "batch_to_run", None) is not None:
            self.slo.counters.prefill_alone += 1
        return batch

    def get_new_prebuilt_batch(self, running_batch: Any) -> Any:
        """Changes (PD decode workers): SGLang admits transferred requests up to
        min(req_to_token_pool.size, max_running_requests); the plan's order applies and its batch
        cap (PolyServe §3.4) lowers that bound for this pass. No hook serves: SGLang reads the
        bound from max_running_requests inside this call."""
        slo = self.slo
        current = slo.pass_state
        current.step += 1  # SGLang's decode loop never calls get_new_batch_prefill
        cap = None
        plan = slo.sync.decide(lambda: self._slo_plan(running_batch)[0], None)
        if plan is not None:
            slo.counters.planned_passes += 1
            order_waiting(self.waiting_queue, plan, slo.states)
            slo.counters.best_effort_waiting = plan.tier_size()
            cap = plan.batch_cap
        current.applied = replace(current.applied, decode_cap=cap)
        if cap is None or cap >= self.max_running_requests:
            return super().get_new_prebuilt_batch(running_batch)
        configured, self.max_running_requests = self.max_running_requests, cap
        try:
            return super().get_new_prebuilt_batch(running_batch)
        finally:
            self.max_running_requests = configured

    def update_running_batch(self, batch: Any) -> Any:
        """Changes: the running requests this pass's plan preempted are retracted first.

        SGLang calls this after the pass's prefill decision and only when no prefill batch runs,
        where it does its own (memory) retraction: a retracted request cannot be re-admitted
        before an in-flight (overlap) result for it is processed. Retracted requests wait in the
        queue and resume from their generated tokens (KV recomputed) when the policy admits them.
        No hook serves: --retraction-policy only orders SGLang's memory-driven retraction."""
        current = self.slo.pass_state
        pending = current.applied.preempt
        if pending:
            current.applied = replace(current.applied, preempt=frozenset())  # taken once
            self.slo.counters.preempted += len(retract_requests(self, batch, pending))
        return super().update_running_batch(batch)

    # ---- SGLang's forward pass and its results -------------------------------------------------
    def run_batch(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Changes: each forward pass is timed for the online perf model (on a GPU by CUDA events,
        read with its result), and under GPU emulation paced to the emulated card's time. No
        hook serves: SGLang has none around the forward."""
        shape = batch_shape(batch)
        steps = self._slo_spec_steps() if shape is not None and shape[0] == 0 else 0
        timer = self.slo.meter.gpu_timer
        bracket = timer.start() if timer is not None and shape is not None else None
        started = time.perf_counter()
        result = super().run_batch(batch, *args, **kwargs)
        if bracket is not None and timer is not None and shape is not None:
            timer.stop(bracket, result, shape, steps)
            if self.slo.meter.pacer is not None:  # an emulated card on a GPU: pace the finished pass
                timer.wait(bracket)
        if shape is not None:
            self.slo.meter.after_step(shape, steps, started, key=id(result), follows_step=self.last_batch is not None)
        return result

    def process_batch_result(self, batch: Any, result: Any) -> Any:
        """Changes: an emulated step's results are used once the emulated card has finished it, a
        GPU pass's time is read (its results are on the host now); finished requests release
        their state and feed the length predictor's accuracy and the compound programs' stage
        costs. No hook serves: SGLang has none for a finished step's requests."""
        self.slo.meter.wait(id(result))
        out = super().process_batch_result(batch, result)
        slo = self.slo
        if slo.meter.gpu_timer is not None:
            slo.meter.learn_timed(slo.meter.gpu_timer.read(result))
        now = slo.clock.now()
        for req in batch.reqs:
            if req.finished():
                answered = not isinstance(req.finished_reason, FINISH_ABORT)  # an abort's length says nothing
                slo.on_finished(req.rid, len(req.origin_input_ids), len(req.output_ids), now, answered)
        if slo.pass_state.step % EXPIRE_EVERY_STEPS == 0:
            slo.compound.expire(now)
            slo.forget_departed({r.rid for r in self.waiting_queue} | {r.rid for r in self.running_batch.reqs})
        return out

    # ---- speculation ---------------------------------------------------------------------------
    def maybe_init_draft_worker(self) -> None:
        """Changes: an EAGLE-family draft worker gets the SLO-adaptive length controller, and the
        draft's cost ratio is recorded for pacing, timing and lever sizing. No hook serves: the
        controller is attached to the draft worker SGLang builds here."""
        super().maybe_init_draft_worker()
        if self.draft_worker is None:
            return
        slo = self.slo
        given = slo.config.spec_draft_ratio
        measured = measured_draft_ratio(self.draft_worker, self.tp_worker.model_runner)
        slo.meter.spec_cost_ratio = float(given if given is not None else measured or 0.0)
        settings = slo.config.speculation
        if settings is not None:
            slo.spec = attach_slo_controller(
                self.draft_worker,
                settings["candidates"],
                slo.meter.spec_cost_ratio,
                settings.get("margin", 0.05),
            )

    def _slo_spec_steps(self) -> int:
        """Drafted tokens per decode request in the next decode batch (0 without speculation)."""
        if self.draft_worker is None:
            return 0
        if self.slo.spec is not None:
            return self.slo.spec.current
        return int(getattr(self.draft_worker, "speculative_num_steps", 0) or 0)

    def _slo_update_speculation(self, running_batch: Any, view: EngineView | None) -> None:
        slo = self.slo
        if slo.spec is None or not running_batch.reqs or not slo.perf.ready:
            return
        try:
            slo.spec.update(view or self._slo_view(running_batch), slo.perf)
        except Exception:  # the length choice must not take the engine down: keep the current one
            slo.planner.errors += 1
            logger.exception("SLO speculation failed at step %d", slo.pass_state.step)

    def _slo_decide(self, running_batch: Any) -> PassDecision:
        """The plan, and the speculation length for the next decode batches (the leading rank's
        work under tensor parallelism; the others apply what it sends)."""
        plan, view = self._slo_plan(running_batch)
        self._slo_update_speculation(running_batch, view)
        return PassDecision(plan, None if self.slo.spec is None else self.slo.spec.current)


class SloScheduler(SloSchedulerMixin, _BaseScheduler):
    """SGLang's Scheduler with the SLO overrides."""


def install_slo_scheduler() -> None:
    """Make SGLang's scheduler process run our subclass (its entry looks the class up by name)."""
    sglang_scheduler_module.Scheduler = SloScheduler
