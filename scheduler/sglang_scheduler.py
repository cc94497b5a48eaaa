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
from typing import Any

from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer
from sglang.srt.managers import scheduler as sglang_scheduler_module
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.managers.scheduler import NextBatchPlan

from scheduler import sglang_emulated_forward as emulated_forward
from scheduler.components.assembly import SloComponents, build_components
from scheduler.components.meter import batch_shape
from scheduler.components.plan_applier import held_positions, order_waiting, set_aside, split_dropped
from scheduler.components.rank_sync import PassDecision, PassSync
from scheduler.components.request_state import injected_arrival, request_slo
from scheduler.components.shedding import shed_finish_reason
from scheduler.components.status import SchedulerStatus
from scheduler.components.status_channel import StatusPublisher, dp_status_address
from scheduler.components.step_timer import GpuStepTimer
from scheduler.components.token_stamps import stamping_streamer_class
from scheduler.components.views import EngineLimits
from scheduler.config import SloServerConfig
from scheduler.core.admission import backlog, queue_is_full
from scheduler.core.compound import EXPIRE_EVERY_STEPS
from scheduler.core.dynamic_chunking import ChunkStep
from scheduler.core.plan_path import DECODE, MIXED, PREFILL, FinalPlan, settings_for
from scheduler.core.types import EngineView
from scheduler.sglang_preemption import retract_requests
from scheduler.sglang_speculation import attach_slo_controller, measured_draft_ratio
from wire import QUEUE_FULL

logger = logging.getLogger("sglang_slo.scheduler")

DRAIN_REFRESH_S = 0.1  # how often the published queue drain estimate is recomputed

_BaseScheduler = sglang_scheduler_module.Scheduler


def _disagg_role(scheduler: Any) -> str:
    """SGLang's DisaggregationMode as a plan role: mixed (co-located), prefill or decode."""
    mode = getattr(scheduler, "disaggregation_mode", None)
    value = str(getattr(mode, "value", mode or "null"))
    return value if value in (PREFILL, DECODE) else MIXED


def _running_requests(scheduler: Any) -> int:
    """Running requests, with the decodes a mixed step carries: SGLang moves them out of
    running_batch into the batch it runs until the step's results are merged back."""
    running, current = scheduler.running_batch, getattr(scheduler, "cur_batch_for_debug", None)
    mixed = current is not None and current is not running and current.forward_mode.is_extend()
    return len(running.reqs) + (len(current.decoding_reqs or ()) if mixed else 0)


def _uncached_len(req: Any) -> int:
    """Tokens still to prefill: prompt (+ output, after a retraction) past the matched/cached
    prefix. For a waiting request the prefix is its last match (SGLang re-matches on admission)."""
    prefix = getattr(req, "prefix_indices", None)
    return len(req.origin_input_ids) + len(req.output_ids) - (len(prefix) if prefix is not None else 0)


def _pass_sync(scheduler: Any) -> PassSync:
    """The ranks that must agree each pass, as SGLang broadcasts their requests: its dp_tp group
    (the attention-TP group under DP attention, else the TP group), then the attention-CP group;
    the leader is the first rank of both."""
    stages = []
    for name in ("dp_tp_group", "attn_cp_group"):
        group = getattr(scheduler, name, None)
        if group is not None and group.world_size > 1:
            stages.append((group, getattr(scheduler, name.replace("_group", "_cpu_group"))))
    if not stages:
        return PassSync()
    from sglang.srt.utils import broadcast_pyobj

    def broadcast(value: Any) -> Any:
        for group, cpu_group in stages:
            value = broadcast_pyobj([value], group.rank, cpu_group, src=group.ranks[0])[0]
        return value

    return PassSync(broadcast, leader=all(group.rank == group.ranks[0] for group, _ in stages))


def _dp_index(scheduler: Any) -> int:
    """This scheduler's data-parallel replica: the attention-DP rank under DP attention, else
    SGLang's dp_rank (None without data parallelism)."""
    ps = scheduler.ps
    if getattr(scheduler, "enable_dp_attention", False):
        return int(ps.attn_dp_rank or 0)
    return int(ps.dp_rank or 0)


def _cuda_step_timer(scheduler: Any) -> GpuStepTimer:
    """CUDA events on the stream the forward runs on: SGLang's forward stream under overlap
    scheduling (made to wait for the scheduling stream's inputs first, as run_batch does), else
    the scheduling loop's current stream."""
    import torch

    def new_event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    if scheduler.enable_overlap:
        forward = scheduler.forward_stream
        return GpuStepTimer(
            new_event, lambda: forward, before_start=lambda: forward.wait_stream(torch.cuda.current_stream())
        )
    return GpuStepTimer(new_event, torch.cuda.current_stream)


class SloSchedulerMixin:
    """The SLO overrides of SGLang's Scheduler: a policy decides order, admission, batch cap and
    chunk. A mixin so that tests can put it over a stand-in engine instead of SGLang's."""

    slo: SloComponents

    def __init__(self, *args: Any, slo_components: SloComponents | None = None, **kwargs: Any) -> None:
        # SGLang's init already calls some of these overrides: the components come first
        self.slo = slo_components if slo_components is not None else build_components(SloServerConfig.from_env())
        super().__init__(*args, **kwargs)
        if self.slo.config.emulate_stand_in:  # emulated steps: logits only, the layers skipped
            emulated_forward.install(self.tp_worker.model_runner)
        self._slo_bind_engine()
        self.slo.sync = _pass_sync(self)
        if self.slo.config.status_address and self.slo.sync.leader and self.ps.pp_rank == 0:
            # one publisher per data-parallel replica (its leading rank), each on its own address
            self.slo_status = StatusPublisher(
                dp_status_address(self.slo.config.status_address, _dp_index(self)),
                self.slo_status_snapshot,
                self.slo.config.status_interval_s,
            )
        logger.info("SLO scheduler active: policy=%s", self.slo.config.policy)

    def _slo_bind_engine(self) -> None:
        """What the engine started with: the plan's settings, the chunk limits, the timing mode."""
        slo = self.slo
        slo.startup_chunk = self.chunked_prefill_size  # a plan never exceeds it
        slo.max_running = self.max_running_requests  # configured; a decode cap lowers it per pass
        tokenizer = getattr(self, "tokenizer", None)
        if tokenizer is not None:  # a text-reading length predictor sees prompts and outputs as text
            slo.views.decode_text = tokenizer.decode
        # The view builder skips waiting requests SGLang cannot have touched since the last pass:
        # only true while SGLang's own policy neither re-sorts nor re-matches the whole queue.
        slo.views.queue.enabled = not (
            getattr(self, "enable_priority_scheduling", False)
            or getattr(self.tree_cache, "supports_fast_match_prefix", lambda: False)()
        )
        role = _disagg_role(self)
        slo.planner.settings = settings_for(
            slo.planner.policy,
            mixed_batching=bool(self.is_mixed_chunk),
            role=role,
            tenant_fairness=slo.config.tenant_fairness,
        )
        slo.chunk_budget = self.chunked_prefill_size
        if role == PREFILL and slo.knobs_on and self.chunked_prefill_size:
            # PD prefill: PolyServe dynamic chunking; the launcher started SGLang at 2B so that a
            # whole-finish step fits the buffers sized at start-up, and normal passes run at B.
            slo.start_dynamic_chunking(self.chunked_prefill_size, self.page_size)
            self.chunked_prefill_size = slo.chunk_budget
        # On a GPU run_batch returns once the forward is launched (with or without overlap
        # scheduling): its wall time is not the pass's, CUDA events on the forward's stream are.
        slo.meter.timing_ok = self.device == "cpu"
        if str(self.device).startswith("cuda"):
            slo.meter.gpu_timer = _cuda_step_timer(self)
        elif not slo.meter.timing_ok and not slo.config.perf_profile:
            logger.warning(
                "forward passes on %s cannot be timed: batch caps and chunk sizes need --slo-perf-profile",
                self.device,
            )

    # ---- SGLang's request intake and output streaming ------------------------------------------
    def process_input_requests(self, recv_reqs: Any) -> Any:
        """Changes: marks the loop iteration's socket read, which tells the intake lag's engine
        part (waiting for this read) from host transit (missing the read before)."""
        self.slo.intake.loop(time.time())
        return super().process_input_requests(recv_reqs)

    def handle_generate_request(self, recv_req: Any) -> Any:
        """Changes: a benchmark's hidden true length ends the request there, like the model's EOS
        would (the tiny model and an emulated card have no meaningful EOS); policies keep seeing
        the client's own cap. Records how late the request reached the scheduler."""
        self.slo.intake.record(injected_arrival(recv_req.sampling_params), time.time())
        self.slo.states.lower_cap_to_hint(recv_req.rid, recv_req.sampling_params)
        return super().handle_generate_request(recv_req)

    def _abort_on_queued_limit(self, recv_req: Any) -> bool:
        """Changes: the waiting queue's bound counts requests (SGLang's --max-queued-requests)
        and prompt tokens (--slo-max-queued-tokens), on co-located and PD workers alike, under
        every policy; a full queue answers 429 `queue_full` with a Retry-After from the queue's
        predicted drain (SGLang: 503, co-located only). Only the incoming request is refused:
        nothing queued is shed for it, and a retracted request (it has output) always returns."""
        if recv_req.output_ids:
            return False
        limits = self.max_queued_requests, self.slo.config.max_queued_tokens
        if limits == (None, None):
            return False
        queued = self._slo_queued()
        tokens = sum(len(r.origin_input_ids) for r in queued) if limits[1] is not None else 0
        if not queue_is_full(len(queued), tokens, len(recv_req.origin_input_ids), *limits):
            return False
        slo, _ = request_slo(recv_req.rid, recv_req.sampling_params)
        finished = shed_finish_reason(QUEUE_FULL, self._slo_queue_drain_s(), slo)
        self.ipc_channels.send_to_tokenizer.send_output(AbortReq(finished_reason=finished, rid=recv_req.rid), recv_req)
        self.slo.shed[QUEUE_FULL] += 1
        self.slo.states.forget(recv_req.rid)
        return True

    def _add_request_to_queue(self, req: Any, is_retracted: bool = False) -> Any:
        """Changes: PD workers bound their queues too (SGLang checks co-located queues only)."""
        if _disagg_role(self) != MIXED and not is_retracted and self._abort_on_queued_limit(req):
            return None
        return super()._add_request_to_queue(req, is_retracted)

    def _slo_queued(self) -> list[Any]:
        """Every request accepted and not yet running: the waiting queue, plus a PD worker's
        bootstrap (prefill) or pre-allocation and transfer (decode) queues."""
        queued = list(self.waiting_queue)
        for name in ("disagg_prefill_bootstrap_queue", "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"):
            pending = getattr(self, name, None)
            if pending is not None:
                queued += getattr(pending, "queue", ())
        return queued

    def _slo_queue_drain_s(self) -> float | None:
        """Seconds until every request queued now has started (a newcomer's wait), from the
        perf model; computed at most once per pass."""
        slo = self.slo
        if slo.drain_step != slo.step:
            try:
                view = self._slo_view(self.running_batch)
                slo.drain_s = backlog(view, slo.perf).drain_s
            except Exception:  # an estimate must never take the engine down
                logger.exception("queue drain estimate failed at step %d", slo.step)
                slo.drain_s = None
            slo.drain_step, slo.drain_at = slo.step, time.monotonic()
        return slo.drain_s

    def init_output_streamer(self) -> None:
        """Changes: each output token is stamped with the time it leaves the scheduler."""
        super().init_output_streamer()
        streamer = self.output_streamer
        streamer.__class__ = stamping_streamer_class(type(streamer), self.slo.states.is_declined)

    # ---- SGLang's prefill admission -----------------------------------------------------------
    def get_new_batch_prefill(self, running_batch: Any) -> Any:
        """Changes: before SGLang's admission (normal and PD prefill workers), the waiting queue
        is dropped, ordered and tiered by this pass's plan, and the batch cap and chunk set; a
        plan that defers prefill makes this pass a decode pass."""
        slo = self.slo
        slo.step += 1
        slo.pending_preempt = set()  # a plan's preemptions hold for its own pass only
        slo.hold, slo.hold_at = frozenset(), None  # and so does its hold
        slo.prefill_open = True
        decision = slo.sync.decide(lambda: self._slo_decide(running_batch), PassDecision())
        if decision.plan is not None:
            self._slo_apply(decision.plan, running_batch)
        if decision.spec_steps is not None and slo.spec is not None:
            slo.spec.current = decision.spec_steps  # the leading rank's choice (its own on that rank)
        if self.waiting_queue and time.monotonic() - slo.drain_at > DRAIN_REFRESH_S:
            self._slo_queue_drain_s()  # what /slo/status and the router's Retry-After read
        elif not self.waiting_queue and slo.drain_s:
            slo.drain_s = 0.0
        if slo.chunker is not None:
            return self._slo_admit(lambda: self._prefill_dynamic_chunk(running_batch))
        if not slo.prefill_open and running_batch.reqs:
            # no prefill fits the running requests' slack this pass: SGLang decodes instead
            slo.prefill_deferred += 1
            return NextBatchPlan(batch_to_run=None, running_batch=running_batch)
        return self._slo_admit(lambda: super(SloSchedulerMixin, self).get_new_batch_prefill(running_batch))

    def _slo_admit(self, admit: Callable[[], Any]) -> Any:
        """SGLang's admission with the plan's held requests out of the waiting queue while it
        runs; they go back to the queue's tail, where their tier already stood."""
        hold, at = self.slo.hold, self.slo.hold_at
        if not hold:
            return admit()
        held = set_aside(self.waiting_queue, hold, at)
        self.slo.views.held_to_tail(hold, at, self.waiting_queue, held)
        try:
            return admit()
        finally:
            self.waiting_queue.extend(held)  # SGLang may have rebound the list: extend the current one

    def get_new_prebuilt_batch(self, running_batch: Any) -> Any:
        """Changes (PD decode workers): SGLang admits transferred requests up to
        min(req_to_token_pool.size, max_running_requests); the plan's order applies and its batch
        cap (PolyServe §3.4) lowers that bound for this pass."""
        slo = self.slo
        slo.step += 1  # SGLang's decode loop never calls get_new_batch_prefill
        cap = None
        plan = slo.sync.decide(lambda: self._slo_plan(running_batch)[0], None)
        if plan is not None:
            order_waiting(self.waiting_queue, plan, slo.states)
            slo.best_effort_waiting = len(plan.best_effort)
            cap = plan.batch_cap
        slo.decode_cap = cap
        if cap is None or cap >= self.max_running_requests:
            return super().get_new_prebuilt_batch(running_batch)
        configured, self.max_running_requests = self.max_running_requests, cap
        try:
            return super().get_new_prebuilt_batch(running_batch)
        finally:
            self.max_running_requests = configured

    def get_num_allocatable_reqs(self, running_bs: int) -> int:
        """Changes: admissions stop at the plan's batch cap, and at one request in a PD
        whole-finish pass (SGLang stops admitting once its step list reaches this count)."""
        allocatable = super().get_num_allocatable_reqs(running_bs)
        if self.slo.batch_cap is not None:
            allocatable = min(allocatable, self.slo.batch_cap - running_bs)
        if self.slo.solo_pass:
            allocatable = min(allocatable, 1)
        return allocatable

    def update_running_batch(self, batch: Any) -> Any:
        """Changes: the running requests this pass's plan preempted are retracted first.

        SGLang calls this after the pass's prefill decision and only when no prefill batch runs,
        where it does its own (memory) retraction: a retracted request cannot be re-admitted
        before an in-flight (overlap) result for it is processed. Retracted requests wait in the
        queue and resume from their generated tokens (KV recomputed) when the policy admits them."""
        pending, self.slo.pending_preempt = self.slo.pending_preempt, set()
        if pending:
            self.slo.preempted += len(retract_requests(self, batch, pending))
        return super().update_running_batch(batch)

    # ---- SGLang's forward pass and its results -------------------------------------------------
    def run_batch(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Changes: each forward pass is timed for the online perf model (on a GPU by CUDA events,
        read with its result), and under GPU emulation paced to the emulated card's time."""
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
        costs."""
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
        if slo.step % EXPIRE_EVERY_STEPS == 0:
            slo.compound.expire(now)
            slo.forget_departed({r.rid for r in self.waiting_queue} | {r.rid for r in self.running_batch.reqs})
        return out

    # ---- speculation ---------------------------------------------------------------------------
    def maybe_init_draft_worker(self) -> None:
        """Changes: an EAGLE-family draft worker gets the SLO-adaptive length controller, and the
        draft's cost ratio is recorded for pacing, timing and knob sizing."""
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
                self.draft_worker, settings["candidates"], slo.meter.spec_cost_ratio, settings.get("margin", 0.05)
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
            logger.exception("SLO speculation failed at step %d", slo.step)

    # ---- plan -> SGLang ------------------------------------------------------------------------
    def _slo_plan(self, running_batch: Any) -> tuple[FinalPlan | None, EngineView | None]:
        """This pass's finished plan and the view it was made from (None, None: nothing waits).
        A chunked prefill in progress is planned for too: its next chunk is this pass's prefill,
        sized (or deferred) to the running requests' slack like any other."""
        if not self.waiting_queue and self.chunked_req is None:
            return None, None
        view = self._slo_view(running_batch)
        knob_model = self.slo.meter.knob_model(self._slo_spec_steps(), self.slo.spec_alpha())
        return self.slo.planner.plan(view, knob_model, self.slo.perf), view

    def _slo_decide(self, running_batch: Any) -> PassDecision:
        """The plan, and the speculation length for the next decode batches (the leading rank's
        work under tensor parallelism; the others apply what it sends)."""
        plan, view = self._slo_plan(running_batch)
        self._slo_update_speculation(running_batch, view)
        return PassDecision(plan, None if self.slo.spec is None else self.slo.spec.current)

    def _slo_view(self, running_batch: Any) -> EngineView:
        limits = EngineLimits(
            max_running_requests=self.max_running_requests,
            chunk_size=self.slo.chunk_budget or 0,  # the last pass's value would only ratchet down
            free_kv_tokens=self._slo_free_kv_tokens(),
            total_kv_tokens=int(self.max_total_num_tokens),
            step=self.slo.step,
            card_busy_s=self.slo.meter.card_busy_s(),
        )
        return self.slo.views.engine_view(self.waiting_queue, self._slo_running_reqs(running_batch), limits)

    def _slo_free_kv_tokens(self) -> int:
        """KV slots a new request can have: free ones plus the radix cache's evictable prefixes,
        as SGLang's own admission counts them. Free slots alone shrink to nothing once finished
        requests' prefixes fill the cache, and SLOs-Serve's DP, which checks memory, then
        admitted nothing (measured live on the Coder mix; the simulator keeps no such cache)."""
        return int(self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size())

    def _slo_running_reqs(self, running_batch: Any) -> list[Any]:
        """The running batch, plus a chunked prefill in progress: SGLang keeps that request in
        neither the waiting queue nor the running batch until its last chunk, but it holds KV,
        takes this pass's prefill and has an SLO to keep. Left out, a pass in which it was the
        only SLO work saw none, so the best-effort tier's hold let every lost request start and
        fill the batch. The simulator counts it as running; the views now match it."""
        chunked = self.chunked_req
        reqs = running_batch.reqs
        if chunked is None or any(r is chunked for r in reqs):
            return reqs
        return [*reqs, chunked]

    def _slo_apply(self, plan: FinalPlan, running_batch: Any) -> None:
        slo = self.slo
        if plan.preempt:
            slo.pending_preempt = set(plan.preempt)
        queue = slo.views.queue
        if plan.drop:
            keep, dropped = split_dropped(self.waiting_queue, plan.drop)
            for req, reason in dropped:
                self._slo_abort_waiting(req, reason, plan.waits.get(req.rid))
            self.waiting_queue[:] = keep
            queue.forget()  # the viewed queue is not this one: the next pass looks at everyone
        viewed = slo.views.waiting_rids(self.waiting_queue)  # None: not the queue this rank viewed
        perm = order_waiting(self.waiting_queue, plan, slo.states, viewed)
        queue.applied(self.waiting_queue, perm)
        slo.best_effort_waiting = len(plan.best_effort)
        slo.hold, slo.held_waiting = plan.hold, len(plan.hold)
        if plan.hold and viewed is not None:  # _slo_admit sets them aside next, from this queue
            slo.hold_at = held_positions(plan, perm, len(self.waiting_queue))
        slo.lost_held_passes += bool(plan.hold)
        if not slo.knobs_on or slo.chunker is not None:
            return
        slo.batch_cap = plan.batch_cap
        slo.prefill_tokens = plan.chunk_size
        slo.prefill_open = plan.prefill
        if slo.startup_chunk:
            self.chunked_prefill_size = self._slo_sglang_chunk(plan.chunk_size, len(running_batch.reqs))
        if plan.batch_cap is not None and len(running_batch.reqs) < plan.batch_cap:
            running_batch.batch_is_full = False  # the cap may have risen since SGLang marked it full

    def _slo_sglang_chunk(self, prefill_tokens: int | None, running: int) -> int:
        """SGLang's chunked_prefill_size for a plan's prefill token budget. With mixed batching
        SGLang charges the decodes riding in the step to the same budget (PrefillAdder's
        rem_chunk_tokens = chunked_prefill_size - running decodes), so they are added back:
        a budget smaller than the running batch left SGLang a negative chunk, and a request
        with a negative extend length crashed the scheduler (torch.arange in compute_position).
        Never above the start-up size, which SGLang sized its buffers on."""
        startup = self.slo.startup_chunk
        assert startup
        if prefill_tokens is None:
            return startup
        riding = running if self.is_mixed_chunk else 0
        return max(1, min(startup, prefill_tokens + riding))

    def _slo_abort_waiting(self, req: Any, reason: str, wait_s: float | None = None) -> None:
        """End a queued request with a 503, `reason` and its predicted wait (what SGLang's abort
        of a queued request frees: its hicache entry; on a PD prefill worker its metadata slot
        and KV sender)."""
        if self.enable_hicache_storage:
            self.tree_cache.release_aborted_request(req.rid)
        if _disagg_role(self) == PREFILL:
            pending = getattr(req, "pending_bootstrap", False)
            maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
            sender = getattr(req, "disagg_kv_sender", None)
            if pending and sender is not None and hasattr(sender, "abort"):
                sender.abort()
        state = self.slo.states.get(req.rid)
        finished = shed_finish_reason(reason, wait_s, None if state is None else state.slo)
        self.ipc_channels.send_to_tokenizer.send_output(AbortReq(finished_reason=finished, rid=req.rid), req)
        self.slo.dropped += 1
        self.slo.shed[finished["reason"]] += 1
        self.slo.states.forget(req.rid)
        self.slo.views.forget(req.rid)
        logger.debug("dropped %s: %s", req.rid, reason)

    def _prefill_dynamic_chunk(self, running_batch: Any) -> Any:
        """One PD prefill pass under dynamic chunking: the request prefilled next (the one being
        chunked, else the queue's head in the plan's order) is finished whole when B < remaining
        < 2B, alone in its step. SGLang reads `chunked_prefill_size` per pass as PrefillAdder's
        rem_chunk_tokens (max_prefill_tokens only stops further admissions once chunking is on,
        so it does not cap the step)."""
        chunker = self.slo.chunker
        assert chunker is not None
        target = self.chunked_req if self.chunked_req is not None else next(iter(self.waiting_queue), None)

        def choose() -> ChunkStep:
            try:
                return chunker.step(None if target is None else _uncached_len(target))
            except Exception:  # never let the rule take the engine down: chunk at B
                self.slo.planner.errors += 1
                logger.exception("dynamic chunking failed at step %d", self.slo.step)
                return ChunkStep(chunker.budget, True)

        step = self.slo.sync.decide(choose, ChunkStep(chunker.budget, True))
        self.chunked_prefill_size, self.slo.solo_pass = step.chunk, not step.admit_others
        try:
            out = super().get_new_batch_prefill(running_batch)
        finally:
            self.chunked_prefill_size, self.slo.solo_pass = chunker.budget, False
        batch = getattr(out, "batch_to_run", None)
        whole = batch is not None and any(r is target for r in batch.reqs) and self.chunked_req is not target
        chunker.record(step, whole)
        return out

    # ---- status --------------------------------------------------------------------------------
    def _slo_kv_used_tokens(self) -> int | None:
        """KV tokens held by requests (cached prefixes that could be evicted count as free)."""
        try:
            free = self._slo_free_kv_tokens()
        except Exception:  # noqa: BLE001 - read from the status thread; never break the status
            return None
        return max(0, int(self.max_total_num_tokens - free))

    def _slo_speculation_status(self) -> dict[str, Any] | None:
        if self.draft_worker is None:
            return None
        base = {
            "algorithm": str(self.server_args.speculative_algorithm),
            "draft_cost_ratio": round(self.slo.meter.spec_cost_ratio, 4),
        }
        if self.slo.spec is None:  # SGLang's fixed length (or its own adaptive params)
            return {**base, "slo_adaptive": False, "steps": self._slo_spec_steps()}
        return {**base, "slo_adaptive": True, **self.slo.spec.status()}

    def _slo_running_requests(self) -> int:
        """Running requests, with the decodes a mixed step carries: SGLang moves them out of
        running_batch into the batch it runs until the step's results are merged back."""
        running, current = self.running_batch, getattr(self, "cur_batch_for_debug", None)
        mixed = current is not None and current is not running and current.forward_mode.is_extend()
        return len(running.reqs) + (len(current.decoding_reqs or ()) if mixed else 0)

    def slo_status_snapshot(self) -> dict[str, Any]:
        slo = self.slo
        role = _disagg_role(self)
        return SchedulerStatus(
            policy=slo.config.policy,
            waiting=len(self.waiting_queue),
            running=self._slo_running_requests(),
            max_running_requests=slo.max_running,
            disaggregation_mode=role if role != MIXED else "null",
            chunked_prefill_size=self.chunked_prefill_size,
            steps=slo.step,
            kv_capacity_tokens=int(self.max_total_num_tokens),
            kv_used_tokens=self._slo_kv_used_tokens(),
            prefill_ms_per_token=slo.meter.prefill_ms_per_token(),
            dropped_in_queue=slo.dropped,
            prefill_deferred=slo.prefill_deferred,
            batch_cap=slo.batch_cap,
            prefill_tokens=slo.prefill_tokens,
            startup_chunk_size=slo.startup_chunk,
            chunk_budget=slo.chunk_budget,
            dynamic_chunking=None if slo.chunker is None else slo.chunker.status(),
            decode_cap=slo.decode_cap if role == DECODE else None,
            mixed_batching=bool(self.is_mixed_chunk),
            best_effort_waiting=slo.best_effort_waiting,
            held_waiting=slo.held_waiting,
            lost_held_passes=slo.lost_held_passes,
            perf_model=slo.meter.perf_status(),
            predictor_accuracy=slo.accuracy.summary(),
            compound={
                "open_programs": len(slo.compound),
                "patterns": len(slo.compound.library),
                "stage_deadlines_matched": slo.compound.matched,
            },
            plan_errors=slo.planner.errors,
            queue_drain_s=None if slo.drain_s is None else round(slo.drain_s, 4),
            shed=dict(slo.shed),
            intake_lag=slo.intake.summary(),
            max_queued_requests=self.max_queued_requests,
            max_queued_tokens=slo.config.max_queued_tokens,
            max_input_tokens=getattr(self, "max_req_input_len", None),
            preempted=slo.preempted,
            emulation=None
            if slo.meter.pacer is None
            else slo.emulation_status(
                int(self.max_total_num_tokens), emulated_forward.is_installed(self.tp_worker.model_runner.model)
            ),
            speculation=self._slo_speculation_status(),
            length_predictor=None
            if slo.lengths is None
            else {"name": slo.lengths.predictor.name, "predictions": slo.lengths.predictions},
        ).to_dict()


class SloScheduler(SloSchedulerMixin, _BaseScheduler):
    """SGLang's Scheduler with the SLO overrides."""


def install_slo_scheduler() -> None:
    """Make SGLang's scheduler process run our subclass (its entry looks the class up by name)."""
    sglang_scheduler_module.Scheduler = SloScheduler
