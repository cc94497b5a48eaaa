"""The adapter: puts the policy core in charge of SGLang's scheduler (the only scheduler-side
module that touches SGLang internals).

It subclasses SGLang's Scheduler inside the spawned scheduler process. Each scheduling pass it
translates SGLang's waiting/running requests into the core's views, asks the policy for a plan,
and applies it through SGLang's own hook points. It also stamps the time each output token
leaves the scheduler into `Req.customized_info`, which SGLang carries to the HTTP process's
`meta_info`, where the SLO report is computed.
"""

from __future__ import annotations

import logging
import math
import time
from http import HTTPStatus
from pathlib import Path
from typing import Any

from server.cpu_support import activate_if_requested
from server.cpu_support.speculation import enable_if_requested as enable_cpu_speculation_if_requested

activate_if_requested()  # before sglang imports, in a spawned child outside the project venv
enable_cpu_speculation_if_requested()  # CPU speculation: the launcher's runtime fixes, here too

from sglang.srt.disaggregation.prefill import maybe_release_metadata_buffer
from sglang.srt.managers import scheduler as sglang_scheduler_module
from sglang.srt.managers.io_struct import AbortReq

from scheduler.config import SloServerConfig
from scheduler.core.analyzer.base import load_predictor
from scheduler.core.analyzer.graph import PatternLibrary, load_deepresearch
from scheduler.core.analyzer.online import BoundAccuracy, LiveLengthBounds
from scheduler.core.batch_limits import batch_knobs
from scheduler.core.clock import WallClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.dynamic_chunking import ChunkStep, budget_from_startup, dynamic_chunk
from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.pacing import Pacer, SlowedPerfModel
from scheduler.core.perf_model import load_perf_model
from scheduler.core.policies import make_policy
from scheduler.core.policies.oracle import ORACLE_SUFFIX
from scheduler.core.programs import ProgramTracker
from scheduler.core.queue_timeout import QUEUE_TIMEOUT_REASON, expired_in_queue
from scheduler.core.slo import SloSpec, SloValidationError
from scheduler.core.slos_serve.spec_length import acceptance
from scheduler.core.types import EngineView, RequestView, StepPlan
from scheduler.sglang_preemption import retract_requests
from scheduler.sglang_speculation import attach_slo_controller, measured_draft_ratio
from server.cpu_support import emulated_forward
from server.slo_reports import TIER_KEY, TOKEN_TS_KEY
from server.slo_request import ORACLE_HINT_PARAM, read_injected
from server.status_channel import StatusPublisher
from speculative.controller import SloSpeculation
from speculative.cost import SpecCost

logger = logging.getLogger("sglang_slo.scheduler")


_BaseScheduler = sglang_scheduler_module.Scheduler


def request_slo(req: Any) -> tuple[SloSpec, float | None]:
    """The SLO and arrival the HTTP layer attached; best-effort if absent or unreadable."""
    try:
        injected = read_injected(getattr(req.sampling_params, "custom_params", None))
    except SloValidationError:
        logger.warning("request %s carried an invalid SLO; treating it as best-effort", req.rid)
        injected = None
    return injected if injected is not None else (SloSpec(), None)


DECLINED_ATTR = "slo_declined"  # set on SGLang's Req by each plan while it waits
PREFILL_PROBE_TOKENS = 1024  # the per-token prefill cost the router sees is the model's at this chunk


def stamp_token_times(reqs: list) -> None:
    """Record when each new output token leaves the scheduler (one stamp per output id), and
    the request's admission tier with it (SGLang slices customized_info per token)."""
    now = time.time()
    for req in reqs:
        if req.customized_info is None:
            req.customized_info = {}
        stamps = req.customized_info.setdefault(TOKEN_TS_KEY, [])
        missing = len(req.output_ids) - len(stamps)
        if missing > 0:
            stamps.extend([now] * missing)
            req.customized_info.setdefault(TIER_KEY, []).extend([int(is_declined(req))] * missing)


def is_declined(req: Any) -> bool:
    """Whether the policy's last plan put this request in the best-effort tier."""
    return getattr(req, DECLINED_ATTR, False)


_STAMPING_CLASSES: dict[type, type] = {}


def _stamping_streamer_class(base: type) -> type:
    """A slot-compatible subclass of SGLang's output streamer that stamps before streaming
    (the streamer uses __slots__, so its method cannot be replaced on the instance)."""
    if base not in _STAMPING_CLASSES:

        def stream_output(self: Any, reqs: list, *args: Any, **kwargs: Any) -> Any:
            stamp_token_times(reqs)
            return base.stream_output(self, reqs, *args, **kwargs)

        _STAMPING_CLASSES[base] = type(
            f"Stamping{base.__name__}", (base,), {"__slots__": (), "stream_output": stream_output}
        )
    return _STAMPING_CLASSES[base]


def _pattern_library(path: str | None) -> PatternLibrary:
    """Seed patterns (deep-research JSON format) plus whatever the server learns online."""
    library = PatternLibrary()
    if path:
        for graph in load_deepresearch(Path(path)):
            library.add(graph)
        logger.info("%d program patterns loaded from %s", len(library), path)
    return library


def _batch_shape(batch: Any) -> tuple[int, int, int] | None:
    """(prefill tokens, decoding requests, KV tokens attended) of a forward batch: what the
    perf model and the emulated GPU's pacing are keyed on."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None or not batch.reqs:
        return None
    if mode.is_decode():
        return 0, len(batch.reqs), sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs)
    if mode.is_extend():  # prefill chunks, plus the decodes riding along in a mixed batch
        decoding = {id(r) for r in (getattr(batch, "decoding_reqs", None) or ())}
        prefill = kv = decodes = 0
        for r in batch.reqs:
            if id(r) in decoding:
                decodes += 1
                kv += len(r.origin_input_ids) + len(r.output_ids)
            else:
                chunk, context = _extend_of(r)
                prefill += chunk
                kv += context
        return prefill, decodes, kv
    return None


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


def _disagg_mode(scheduler: Any) -> str:
    """SGLang's DisaggregationMode value: null, prefill or decode."""
    mode = getattr(scheduler, "disaggregation_mode", None)
    return str(getattr(mode, "value", mode or "null"))


def _extend_of(req: Any) -> tuple[int, int]:
    """(tokens this extend step computes, context length after it) for one prefilling request:
    SGLang 0.5.17 keeps the step's token range in `extend_range`."""
    span = req.extend_range
    return int(span.end - span.start), int(span.end)


class SloScheduler(_BaseScheduler):
    """SGLang's Scheduler with an SLO policy deciding order and admission."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.slo_config = SloServerConfig.from_env()
        self.slo_clock = WallClock()
        profile, emulate = self.slo_config.perf_profile, self.slo_config.emulate_profile
        slowdown = self.slo_config.emulate_slowdown if emulate else 1.0
        prior = SlowedPerfModel(load_perf_model(profile, kind="roofline"), slowdown) if profile else None
        self.slo_perf = OnlinePerfModel(prior)
        self.slo_pacer = Pacer(SlowedPerfModel(load_perf_model(emulate, kind="table"), slowdown)) if emulate else None
        self._slo_distortion_logged = -math.inf
        self.slo_policy = make_policy(self.slo_config.policy, self.slo_perf, **self.slo_config.policy_params)
        self.slo_knobs_on = self.slo_config.policy != "fcfs"  # fcfs stays stock SGLang
        self.slo_oracle = self.slo_config.policy.endswith(ORACLE_SUFFIX)  # benchmarks only
        self.slo_batch_cap: int | None = None
        self.slo_decode_cap: int | None = None  # PD decode: admission cap at the last pass
        self.slo_solo_pass = False  # PD prefill: this pass finishes one request whole, alone
        self.slo_dyn_passes = 0  # PD prefill: passes that chose to finish a request whole
        self.slo_dyn_whole = 0  # ... and did (its last chunk ran in that step)
        self.slo_best_effort_waiting = 0
        self.slo_accuracy = BoundAccuracy()
        self.slo_compound = CompoundDeadlines(_pattern_library(self.slo_config.program_patterns))
        self._slo_stage_deadlines: dict[str, float | None] = {}
        self.slo_programs = ProgramTracker()
        self.slo_step = 0
        self.slo_dropped = 0
        self.slo_plan_errors = 0
        self.slo_pending_preempt: set[str] = set()  # running rids this pass's plan retracts
        self.slo_preempted = 0
        self._slo_views: dict[str, tuple[SloSpec, float]] = {}
        self._slo_client_caps: dict[str, int | None] = {}  # client caps the hidden hint lowered
        self.slo_lengths = self._load_length_predictor(
            self.slo_config.length_predictor, self.slo_config.predictor_quantile
        )
        self.slo_spec: SloSpeculation | None = None  # set when the draft worker is built
        self.slo_spec_cost_ratio = 0.0  # draft step / target decode step, for pacing and timing
        super().__init__(*args, **kwargs)
        if self.slo_config.emulate_stand_in:  # emulated steps: logits only, the layers skipped
            emulated_forward.install(self.tp_worker.model_runner)
        self._slo_init_engine_limits()
        # With the overlap scheduler on a GPU, run_batch returns once the forward is launched:
        # its wall time is not the iteration's, so it must not train the perf model.
        self.slo_timing_ok = not (self.enable_overlap and self.device != "cpu")
        if not self.slo_timing_ok and not self.slo_config.perf_profile:
            logger.warning(
                "overlap scheduling on %s: forward passes cannot be timed here, so batch caps and chunk "
                "sizes need --slo-perf-profile (or --disable-overlap-schedule)",
                self.device,
            )
        if self.slo_config.status_address and self.ps.tp_rank == 0 and self.ps.pp_rank == 0:
            self.slo_status = StatusPublisher(
                self.slo_config.status_address, self.slo_status_snapshot, self.slo_config.status_interval_s
            )
        logger.info("SLO scheduler active: policy=%s", self.slo_config.policy)

    def _slo_init_engine_limits(self) -> None:
        """What the engine started with, and the normal-pass prefill budget derived from it."""
        self.slo_startup_chunk = self.chunked_prefill_size  # a plan never exceeds it
        self.slo_max_running = self.max_running_requests  # configured; the decode cap lowers it per pass
        self.slo_pd_mode = _disagg_mode(self)
        # A PD prefill worker chunks dynamically (PolyServe §4.7): its launcher starts it at 2B
        # (startup_chunk_size) so that a whole-finish step fits the buffers sized at start-up.
        self.slo_chunk_budget = self.slo_startup_chunk
        if self._slo_dynamic_chunking():
            self.slo_chunk_budget = budget_from_startup(self.slo_startup_chunk)
            self.chunked_prefill_size = self.slo_chunk_budget

    # ---- speculation -------------------------------------------------------------------
    def maybe_init_draft_worker(self) -> None:
        super().maybe_init_draft_worker()
        settings = self.slo_config.speculation
        if self.draft_worker is None:
            return
        given = self.slo_config.spec_draft_ratio
        measured = measured_draft_ratio(self.draft_worker, self.tp_worker.model_runner)
        self.slo_spec_cost_ratio = float(given if given is not None else measured or 0.0)
        if settings is not None:
            self.slo_spec = attach_slo_controller(
                self.draft_worker, settings["candidates"], self.slo_spec_cost_ratio, settings.get("margin", 0.05)
            )

    def _slo_spec_steps(self) -> int:
        """Drafted tokens per decode request in the next decode batch (0 without speculation)."""
        if self.draft_worker is None:
            return 0
        if self.slo_spec is not None:
            return self.slo_spec.current
        return int(getattr(self.draft_worker, "speculative_num_steps", 0) or 0)

    def _slo_update_speculation(self, running_batch: Any, view: EngineView | None) -> None:
        if self.slo_spec is None or not running_batch.reqs or not self.slo_perf.ready:
            return
        try:
            self.slo_spec.update(view or self.slo_engine_view(running_batch), self.slo_perf)
        except Exception:  # the length choice must not take the engine down: keep the current one
            self.slo_plan_errors += 1
            logger.exception("SLO speculation failed at step %d", self.slo_step)

    # ---- token timestamps -------------------------------------------------------------
    def init_output_streamer(self) -> None:
        super().init_output_streamer()
        streamer = self.output_streamer
        streamer.__class__ = _stamping_streamer_class(type(streamer))

    @staticmethod
    def _load_length_predictor(path: str | None, quantile: float | None) -> LiveLengthBounds | None:
        if not path:
            return None
        predictor = load_predictor(path)
        if quantile is not None:
            if not hasattr(predictor, "quantile"):
                raise ValueError(f"predictor {predictor.name} has no quantile to set")
            predictor.quantile = quantile
        logger.info("length predictor %s loaded from %s", predictor.name, path)
        return LiveLengthBounds(predictor)

    @staticmethod
    def _oracle_hint(req: Any) -> int | None:
        value = (getattr(req.sampling_params, "custom_params", None) or {}).get(ORACLE_HINT_PARAM)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    def handle_generate_request(self, recv_req: Any) -> Any:
        """A benchmark's true output length (the hidden hint) ends the request there, like the
        model's EOS would (the tiny model and an emulated card have no meaningful EOS). Policies
        keep seeing the client's own cap."""
        hint = self._oracle_hint(recv_req)
        if hint is not None:
            params = recv_req.sampling_params
            cap = params.max_new_tokens
            self._slo_client_caps[recv_req.rid] = cap
            params.max_new_tokens = hint if cap is None else min(cap, hint)
            params.ignore_eos = True
        return super().handle_generate_request(recv_req)

    def _decode(self, token_ids: list[int]) -> str:
        tokenizer = getattr(self, "tokenizer", None)
        return tokenizer.decode(token_ids) if tokenizer is not None else ""

    # ---- the core's view of SGLang's state ---------------------------------------------
    def _slo_of(self, req: Any) -> tuple[SloSpec, float]:
        cached = self._slo_views.get(req.rid)
        if cached is None:
            spec, arrival = request_slo(req)
            cached = (spec, arrival if arrival is not None else self.slo_clock.now())
            if len(self._slo_views) > 4 * (len(self.waiting_queue) + 1024):
                live = {r.rid for r in self.waiting_queue} | {r.rid for r in self.running_batch.reqs}
                self._slo_views = {k: v for k, v in self._slo_views.items() if k in live}
                self._slo_stage_deadlines = {k: v for k, v in self._slo_stage_deadlines.items() if k in live}
                self._slo_client_caps = {k: v for k, v in self._slo_client_caps.items() if k in live}
            self._slo_views[req.rid] = cached
        return cached

    def _stage_deadline(self, rid: str, spec: SloSpec, program_arrival: float) -> float | None:
        """Fixed when a stage's request is first seen: D_s = φ(s)·D from matched patterns."""
        if rid not in self._slo_stage_deadlines:
            self._slo_stage_deadlines[rid] = self.slo_compound.stage_deadline(
                spec.program_id, spec.stage, program_arrival, spec.deadline_ms / 1000.0, self.slo_clock.now()
            )
        return self._slo_stage_deadlines[rid]

    def _request_view(self, req: Any) -> RequestView:
        spec, arrival = self._slo_of(req)
        stamps = (req.customized_info or {}).get(TOKEN_TS_KEY) or []
        program_arrival = stage_deadline = None
        if spec.program_id is not None:
            program_arrival = self.slo_programs.arrival(spec.program_id, arrival)
            if spec.deadline_ms is not None:
                stage_deadline = self._stage_deadline(req.rid, spec, program_arrival)
        predicted = None
        if self.slo_lengths is not None:
            predicted = self.slo_lengths.bound(
                req.rid,
                lambda: self._decode(req.origin_input_ids),
                len(req.origin_input_ids),
                spec.program_id,
                len(req.output_ids),
                lambda n: self._decode(req.output_ids[:n]),
            )
        return RequestView(
            rid=req.rid,
            slo=spec,
            arrival=arrival,
            prompt_len=len(req.origin_input_ids),
            generated=len(req.output_ids),
            max_new_tokens=self._slo_client_caps.get(req.rid, req.sampling_params.max_new_tokens),
            predicted_output_len=predicted,
            first_token_time=stamps[0] if stamps else None,
            prefix_cached=len(req.prefix_indices) if getattr(req, "prefix_indices", None) is not None else 0,
            program_arrival=program_arrival,
            attained_service=float(len(req.origin_input_ids) + len(req.output_ids)),
            stage_deadline=stage_deadline,
            best_effort_tier=spec.is_best_effort or is_declined(req),
            oracle_output_len=self._oracle_hint(req) if self.slo_oracle else None,
        )

    def slo_engine_view(self, running_batch: Any) -> EngineView:
        return EngineView(
            now=self.slo_clock.now(),
            waiting=[self._request_view(r) for r in self.waiting_queue],
            running=[self._request_view(r) for r in running_batch.reqs],
            max_running_requests=self.max_running_requests,
            chunk_size=self.slo_chunk_budget or 0,  # the last pass's value would only ratchet down
            free_kv_tokens=int(self.token_to_kv_pool_allocator.available_size()),
            total_kv_tokens=int(self.max_total_num_tokens),
            step=self.slo_step,
        )

    # ---- applying the plan ---------------------------------------------------------------
    def get_new_batch_prefill(self, running_batch: Any) -> Any:
        """Normal and PD prefill workers (SGLang's disagg prefill loop calls this too)."""
        self.slo_step += 1
        self.slo_pending_preempt = set()  # a plan's preemptions hold for its own pass only
        view = None
        if self.waiting_queue:
            try:
                view = self.slo_engine_view(running_batch)
                plan = self.slo_policy.plan(view)
                for rid in expired_in_queue(view.waiting, view.now):
                    plan.drop.setdefault(rid, QUEUE_TIMEOUT_REASON)
                self._apply_plan(plan)
                self._apply_knobs(plan, view, running_batch)
            except Exception:  # a policy bug must not take the engine down: keep SGLang's order
                self.slo_plan_errors += 1
                logger.exception("SLO policy %s failed at step %d", self.slo_config.policy, self.slo_step)
        self._slo_update_speculation(running_batch, view)
        if self._slo_dynamic_chunking():
            return self._prefill_dynamic_chunk(running_batch)
        return super().get_new_batch_prefill(running_batch)

    def _slo_dynamic_chunking(self) -> bool:
        """PD prefill worker, SLO knobs on (fcfs stays stock SGLang), chunked prefill on."""
        return self.slo_pd_mode == "prefill" and self.slo_knobs_on and bool(self.slo_startup_chunk)

    def _prefill_dynamic_chunk(self, running_batch: Any) -> Any:
        """One PD prefill pass under PolyServe's dynamic chunking: the next request to prefill
        (the one being chunked, else the queue's head in the plan's order) is finished whole
        when B < remaining < 2B, alone in its step; otherwise the budget is B. SGLang reads
        `chunked_prefill_size` per pass as PrefillAdder's rem_chunk_tokens (max_prefill_tokens
        only stops further admissions once chunking is on, so it does not cap the step)."""
        budget = self.slo_chunk_budget
        step, target = ChunkStep(budget, True), None
        try:
            target = self.chunked_req if self.chunked_req is not None else next(iter(self.waiting_queue), None)
            if target is not None:
                step = dynamic_chunk(budget, _uncached_len(target), self.page_size, self.slo_startup_chunk)
        except Exception:  # never let the rule take the engine down: chunk at B
            self.slo_plan_errors += 1
            logger.exception("dynamic chunking failed at step %d", self.slo_step)
        self.chunked_prefill_size, self.slo_solo_pass = step.chunk, not step.admit_others
        try:
            out = super().get_new_batch_prefill(running_batch)
        finally:
            self.chunked_prefill_size, self.slo_solo_pass = budget, False
        if not step.admit_others:
            self.slo_dyn_passes += 1
            batch = getattr(out, "batch_to_run", None)
            if batch is not None and any(r is target for r in batch.reqs) and self.chunked_req is not target:
                self.slo_dyn_whole += 1
        return out

    def get_new_prebuilt_batch(self, running_batch: Any) -> Any:
        """PD decode worker: admits transferred requests, up to min(req_to_token_pool.size,
        max_running_requests) in SGLang. The SLO batch cap (PolyServe §3.4) lowers that bound
        for this pass, and the waiting requests are taken in the policy's order."""
        self.slo_step += 1  # SGLang's decode loop never calls get_new_batch_prefill
        cap = self._slo_decode_cap(running_batch) if self.waiting_queue else None
        if cap is None or cap >= self.max_running_requests:
            return super().get_new_prebuilt_batch(running_batch)
        configured, self.max_running_requests = self.max_running_requests, cap
        try:
            return super().get_new_prebuilt_batch(running_batch)
        finally:
            self.max_running_requests = configured

    def _slo_decode_cap(self, running_batch: Any) -> int | None:
        """Order the decode worker's waiting requests and return this pass's running-batch cap.
        Nothing is dropped or preempted here: these requests already hold transferred KV."""
        try:
            view = self.slo_engine_view(running_batch)
            plan = self.slo_policy.plan(view)
            self._order_waiting(plan)
            cap = self._knob_values(plan, view)[0] if self.slo_knobs_on else None
        except Exception:  # a policy bug must not take the engine down: SGLang's admission
            self.slo_plan_errors += 1
            logger.exception("SLO policy %s failed at decode step %d", self.slo_config.policy, self.slo_step)
            cap = None
        self.slo_decode_cap = cap
        return cap

    def _apply_plan(self, plan: StepPlan) -> None:
        if plan.preempt:
            self.slo_pending_preempt = set(plan.preempt)
        if plan.drop:
            self._drop_waiting(plan.drop)
        self._order_waiting(plan)

    def _order_waiting(self, plan: StepPlan) -> None:
        if plan.order is not None or plan.best_effort:
            # Admitted requests first in the policy's order; the best-effort tier runs on what
            # is left of this step's budget (SLOs-Serve §4.1), so declined requests still run.
            rank = {rid: i for i, rid in enumerate(plan.order or [])}
            last = len(rank)
            tier = plan.best_effort
            self.waiting_queue.sort(key=lambda r: (r.rid in tier, rank.get(r.rid, last)))
        for r in self.waiting_queue:  # the tier a request starts in is the one it runs in
            setattr(r, DECLINED_ATTR, r.rid in plan.best_effort)
        self.slo_best_effort_waiting = len(plan.best_effort)
        if logger.isEnabledFor(logging.DEBUG) and self.waiting_queue:
            logger.debug("step %d order: %s", self.slo_step, [r.rid for r in self.waiting_queue[:8]])
            for rid in plan.best_effort:
                logger.debug(
                    "step %d: %s deferred to the best-effort tier by %s", self.slo_step, rid, self.slo_config.policy
                )

    def _knob_values(self, plan: StepPlan, view: EngineView) -> tuple[int | None, int | None]:
        """Batch cap and prefill chunk: the plan's own, else derived from the perf model."""
        cap, chunk = plan.batch_cap, plan.chunk_size
        if (cap is None or chunk is None) and self.slo_perf.ready:
            steps = self._slo_spec_steps()
            if steps > 0 and self.slo_spec is not None:
                # a speculative batch may last Acc(s) TPOTs and costs its drafts and verify tokens
                perf = SpecCost(self.slo_perf, self.slo_spec_cost_ratio).at_steps(steps)
                knobs = batch_knobs(view, perf, acceptance(steps, self.slo_spec.acceptance.alpha))
            else:
                knobs = batch_knobs(view, self.slo_perf)
            cap = cap if cap is not None else knobs.batch_cap
            chunk = chunk if chunk is not None else knobs.chunk_size
        return cap, chunk

    def _apply_knobs(self, plan: StepPlan, view: EngineView, running_batch: Any) -> None:
        if not self.slo_knobs_on:
            return
        if self.slo_pd_mode == "prefill":
            # No decode shares a PD prefill step: TPOT-derived caps and chunks do not apply
            # (PolyServe §3.4); the step budget is dynamic chunking's.
            self.slo_batch_cap = None
            return
        cap, chunk = self._knob_values(plan, view)
        self.slo_batch_cap = cap
        # Without mixed batches every prefill step stalls all decodes, so a smaller chunk only
        # adds steps: the chunk knob applies to mixed batching alone.
        if self.slo_startup_chunk and self.is_mixed_chunk:
            self.chunked_prefill_size = min(chunk, self.slo_startup_chunk) if chunk else self.slo_startup_chunk
        if cap is not None and len(running_batch.reqs) < cap:
            running_batch.batch_is_full = False  # the cap may have risen since SGLang marked it full
        if logger.isEnabledFor(logging.DEBUG) and cap is not None and len(running_batch.reqs) >= cap:
            logger.debug("step %d: admission held at %d running (batch cap)", self.slo_step, cap)

    def update_running_batch(self, batch: Any) -> Any:
        """Retract the running requests this pass's plan preempted, then SGLang's decode step.

        SGLang calls this after the pass's prefill decision and only when no prefill batch runs,
        where it does its own (memory) retraction: a retracted request cannot be re-admitted
        before an in-flight (overlap) result for it is processed. Retracted requests wait in the
        queue and resume from their generated tokens (KV recomputed) when the policy admits them."""
        pending, self.slo_pending_preempt = self.slo_pending_preempt, set()
        if pending:
            self.slo_preempted += len(retract_requests(self, batch, pending))
        return super().update_running_batch(batch)

    def get_num_allocatable_reqs(self, running_bs: int) -> int:
        allocatable = super().get_num_allocatable_reqs(running_bs)
        if self.slo_batch_cap is not None:
            allocatable = min(allocatable, self.slo_batch_cap - running_bs)
        if self.slo_solo_pass:  # SGLang stops admitting once its step list reaches this count
            allocatable = min(allocatable, 1)
        return allocatable

    # ---- measuring the engine ----------------------------------------------------------------
    def run_batch(self, batch: Any, *args: Any, **kwargs: Any) -> Any:
        """Times each forward pass for the online perf model (synchronous on CPU; with CUDA
        overlap scheduling this measures launch, see README)."""
        shape = _batch_shape(batch)
        steps = self._slo_spec_steps() if shape is not None and shape[0] == 0 else 0
        started = time.perf_counter()
        result = super().run_batch(batch, *args, **kwargs)
        if shape is None:
            return result
        prefill, decodes, kv = shape
        spec_tokens = decodes * steps  # a speculative decode verifies s drafts per request
        if self.slo_pacer is not None:  # emulated GPU: the step lasts what the profile says
            drafts = SpecCost(self.slo_pacer.model, self.slo_spec_cost_ratio).draft_time(decodes, kv, steps)
            target = self.slo_pacer.target_s(*shape, spec_tokens) + drafts  # waited for in process_batch_result
            measured = self.slo_pacer.launch(id(result), started, target, follows_step=self.last_batch is not None)
            self._log_distortion()
        elif self.slo_timing_ok:
            measured = time.perf_counter() - started
        else:
            return result
        # the target's model learns target work only: the drafts' share is the draft cost's
        drafts = SpecCost(self.slo_perf, self.slo_spec_cost_ratio).draft_time(decodes, kv, steps)
        self.slo_perf.observe(prefill, decodes, kv, spec_tokens, max(measured - drafts, 1e-6))
        return result

    def _log_distortion(self) -> None:
        """Warn (at most every 30 s) when the host cannot keep up with the emulated GPU."""
        pacer, now = self.slo_pacer, time.monotonic()
        if pacer.steps >= 100 and pacer.late > 0.05 * pacer.steps and now - self._slo_distortion_logged > 30:
            self._slo_distortion_logged = now  # the full report (it sorts the error window) only then
            report = pacer.report()
            logger.warning(
                "emulation of %s distorted: %.1f%% of %d steps late by %.2f ms on average (host too slow)",
                self.slo_config.emulate_name,
                100 * report.late_share,
                report.steps,
                report.mean_overrun_ms,
            )

    def process_batch_result(self, batch: Any, result: Any) -> Any:
        if self.slo_pacer is not None:  # an emulated step's results exist once the card is done
            self.slo_pacer.wait(id(result))
        out = super().process_batch_result(batch, result)
        now = self.slo_clock.now()
        for req in batch.reqs:
            if not req.finished():
                continue
            self._slo_client_caps.pop(req.rid, None)
            if self.slo_lengths is not None:
                entry = self.slo_lengths.forget(req.rid)
                if entry is not None:
                    self.slo_accuracy.record(entry.initial, len(req.output_ids))
            spec = self._slo_views.get(req.rid, (None, None))[0]
            if spec is not None and spec.program_id is not None:
                self.slo_compound.on_finish(
                    spec.program_id, spec.stage, len(req.origin_input_ids), len(req.output_ids), now
                )
        if self.slo_step % 256 == 0:
            self.slo_compound.expire(now)
        return out

    def _drop_waiting(self, reasons: dict[str, str]) -> None:
        keep = []
        for req in self.waiting_queue:
            reason = reasons.get(req.rid)
            if reason is None:
                keep.append(req)
                continue
            if self.enable_hicache_storage:
                self.tree_cache.release_aborted_request(req.rid)
            if self.slo_pd_mode == "prefill":
                self._release_pd_prefill(req)
            self.ipc_channels.send_to_tokenizer.send_output(
                AbortReq(
                    finished_reason={
                        "type": "abort",
                        "status_code": HTTPStatus.SERVICE_UNAVAILABLE,
                        "message": reason,
                    },
                    rid=req.rid,
                ),
                req,
            )
            self.slo_dropped += 1
            logger.debug("dropped %s: %s", req.rid, reason)
        self.waiting_queue[:] = keep

    def _release_pd_prefill(self, req: Any) -> None:
        """What SGLang's abort_request frees for a queued PD prefill request: its metadata
        buffer slot, and the KV sender when bootstrap is still pending."""
        pending = getattr(req, "pending_bootstrap", False)
        maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        sender = getattr(req, "disagg_kv_sender", None)
        if pending and sender is not None and hasattr(sender, "abort"):
            sender.abort()

    # ---- status ----------------------------------------------------------------------------
    def _slo_kv_used_tokens(self) -> int | None:
        """KV tokens held by requests (cached prefixes that could be evicted count as free)."""
        try:
            free = self.token_to_kv_pool_allocator.available_size() + self.tree_cache.evictable_size()
        except Exception:  # noqa: BLE001 - read from the status thread; never break the status
            return None
        return max(0, int(self.max_total_num_tokens - free))

    def _slo_speculation_status(self) -> dict[str, Any] | None:
        if self.draft_worker is None:
            return None
        base = {
            "algorithm": str(self.server_args.speculative_algorithm),
            "draft_cost_ratio": round(self.slo_spec_cost_ratio, 4),
        }
        if self.slo_spec is None:  # SGLang's fixed length (or its own adaptive params)
            return {**base, "slo_adaptive": False, "steps": self._slo_spec_steps()}
        return {**base, "slo_adaptive": True, **self.slo_spec.status()}

    def slo_status_snapshot(self) -> dict[str, Any]:
        return {
            "policy": self.slo_config.policy,
            "waiting": len(self.waiting_queue),
            "running": _running_requests(self),
            "max_running_requests": self.slo_max_running,  # not the decode cap's per-pass value
            "disaggregation_mode": self.slo_pd_mode,
            "chunked_prefill_size": self.chunked_prefill_size,
            "steps": self.slo_step,
            "kv_capacity_tokens": int(self.max_total_num_tokens),
            "kv_used_tokens": self._slo_kv_used_tokens(),
            "prefill_ms_per_token": round(
                1000 * self.slo_perf.step_time(PREFILL_PROBE_TOKENS, 0, 0) / PREFILL_PROBE_TOKENS, 6
            ),
            "dropped_in_queue": self.slo_dropped,
            "batch_cap": self.slo_batch_cap,
            "chunk_size": self.chunked_prefill_size,
            "startup_chunk_size": self.slo_startup_chunk,
            "chunk_budget": self.slo_chunk_budget,
            "dynamic_chunking": {"whole_finish_passes": self.slo_dyn_passes, "finished_whole": self.slo_dyn_whole}
            if self._slo_dynamic_chunking()
            else None,
            "decode_cap": self.slo_decode_cap if self.slo_pd_mode == "decode" else None,
            "mixed_batching": bool(self.is_mixed_chunk),
            "best_effort_waiting": self.slo_best_effort_waiting,
            "perf_model": {
                "ready": self.slo_perf.ready,
                "observed_iterations": self.slo_perf.observed,
                "recent_rel_error": self.slo_perf.recent_error(),
                "predicted_decode_ms": {
                    str(n): round(1000 * self.slo_perf.step_time(0, n, 128 * n), 3) for n in (1, 8, 32)
                },
            },
            "predictor_accuracy": self.slo_accuracy.summary(),
            "compound": {
                "open_programs": len(self.slo_compound),
                "patterns": len(self.slo_compound.library),
                "stage_deadlines_matched": self.slo_compound.matched,
            },
            "plan_errors": self.slo_plan_errors,
            "preempted": self.slo_preempted,
            "emulation": None
            if self.slo_pacer is None
            else {
                "gpu_model": self.slo_config.emulate_name,
                "slowdown": self.slo_config.emulate_slowdown,
                "kv_token_capacity": int(self.max_total_num_tokens),
                "stand_in_forward": emulated_forward.is_installed(self.tp_worker.model_runner.model),
                **self.slo_pacer.report().to_dict(),
            },
            "speculation": self._slo_speculation_status(),
            "length_predictor": None
            if self.slo_lengths is None
            else {"name": self.slo_lengths.predictor.name, "predictions": self.slo_lengths.predictions},
            "time": time.time(),
        }


def run_slo_scheduler_process(*args: Any, **kwargs: Any) -> None:
    """Scheduler process entry point handed to SGLang's launch_server (spawn-importable)."""
    sglang_scheduler_module.Scheduler = SloScheduler
    sglang_scheduler_module.run_scheduler_process(*args, **kwargs)
