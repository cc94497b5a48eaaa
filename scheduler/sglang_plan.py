"""Plan application on SGLang's scheduler: the pass's view, its finished plan, and the plan turned
into SGLang state (waiting order, drops, held requests, batch cap, chunk size, PD dynamic
chunking). A mixin of `SloSchedulerMixin`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from scheduler.components.assembly import SloComponents
from scheduler.components.plan_applier import held_positions, order_waiting, set_aside, split_dropped
from scheduler.components.views import EngineLimits
from scheduler.core.dynamic_chunking import ChunkStep
from scheduler.core.plan_path import FinalPlan
from scheduler.core.types import EngineView
from scheduler.sglang_engine import uncached_len

logger = logging.getLogger("sglang_slo.scheduler")


class SloPlanMixin:
    slo: SloComponents
    waiting_queue: list[Any]
    chunked_req: Any
    chunked_prefill_size: int | None

    def _slo_plan(self, running_batch: Any) -> tuple[FinalPlan | None, EngineView | None]:
        """This pass's finished plan and the view it was made from (None, None: nothing waits).
        A chunked prefill in progress is planned for too: its next chunk is this pass's prefill,
        sized (or deferred) to the running requests' slack like any other."""
        if not self.waiting_queue and self.chunked_req is None:
            return None, None
        view = self._slo_view(running_batch)
        lever_model = self.slo.meter.lever_model(self._slo_spec_steps(), self.slo.spec_alpha())
        return self.slo.planner.plan(view, lever_model, self.slo.perf), view

    def _slo_view(self, running_batch: Any) -> EngineView:
        engine: Any = self
        limits = EngineLimits(
            max_running_requests=engine.max_running_requests,
            chunk_size=self.slo.started.chunk_budget or 0,  # the last pass's value would only ratchet down
            free_kv_tokens=self._slo_free_kv_tokens(),
            total_kv_tokens=int(engine.max_total_num_tokens),
            step=self.slo.pass_state.step,
            card_busy_s=self.slo.meter.card_busy_s(),
        )
        return self.slo.views.engine_view(self.waiting_queue, self._slo_running_reqs(running_batch), limits)

    def _slo_free_kv_tokens(self) -> int:
        """KV slots a new request can have: free ones plus the radix cache's evictable prefixes,
        as SGLang's own admission counts them. Free slots alone shrink to nothing once finished
        requests' prefixes fill the cache, and SLOs-Serve's DP, which checks memory, then
        admitted nothing (the simulator keeps no such cache)."""
        engine: Any = self
        return int(engine.token_to_kv_pool_allocator.available_size() + engine.tree_cache.evictable_size())

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
        slo, counters = self.slo, self.slo.counters
        counters.planned_passes += 1
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
        counters.best_effort_waiting = plan.tier_size()
        counters.held_waiting = plan.held_size()
        counters.lost_held_passes += bool(plan.hold)
        hold_at = None
        if plan.hold and viewed is not None:  # _slo_admit sets them aside next, from this queue
            hold_at = held_positions(plan, perm, len(self.waiting_queue))
        applied = replace(slo.pass_state.applied, preempt=frozenset(plan.preempt), hold=plan.hold, hold_at=hold_at)
        levers = slo.levers_on and slo.chunker is None  # fcfs and PD dynamic chunking keep SGLang's
        if levers:
            applied = replace(
                applied,
                batch_cap=plan.batch_cap,
                prefill_tokens=plan.chunk_size,
                prefill_open=plan.prefill,
                prefill_alone=plan.prefill_alone and bool(getattr(self, "is_mixed_chunk", False)),
            )
        slo.pass_state.applied = applied  # set once: the hooks read this pass's plan whole
        if not levers:
            return
        if slo.started.startup_chunk:
            riding = 0 if applied.prefill_alone else len(running_batch.reqs)
            self.chunked_prefill_size = self._slo_sglang_chunk(plan.chunk_size, riding)
        if plan.batch_cap is not None and len(running_batch.reqs) < plan.batch_cap:
            running_batch.batch_is_full = False  # the cap may have risen since SGLang marked it full

    def _slo_sglang_chunk(self, prefill_tokens: int | None, riding: int) -> int:
        """SGLang's chunked_prefill_size for a plan's prefill token budget. With mixed batching
        SGLang charges the decodes `riding` in the step to the same budget (PrefillAdder's
        rem_chunk_tokens = chunked_prefill_size - running decodes), so they are added back:
        a budget smaller than the running batch left SGLang a negative chunk, and a request
        with a negative extend length crashed the scheduler (torch.arange in compute_position).
        Never above the start-up size, which SGLang sized its buffers on."""
        startup = self.slo.started.startup_chunk
        assert startup
        if prefill_tokens is None:
            return startup
        riding = riding if getattr(self, "is_mixed_chunk", False) else 0
        return max(1, min(startup, prefill_tokens + riding))

    def _slo_admission_limit(self, running_bs: int) -> int | None:
        """How many requests this pass's prefill may hold at most (the resumed chunk counts):
        the plan's batch cap less the running requests, one in a PD whole-finish pass; None:
        no limit of ours."""
        applied = self.slo.pass_state.applied
        limit = None if applied.batch_cap is None else applied.batch_cap - running_bs
        if applied.solo_pass:
            limit = 1 if limit is None else min(limit, 1)
        return limit

    def _slo_admit(self, admit: Callable[[], Any]) -> Any:
        """SGLang's admission with the plan's held requests out of the waiting queue while it
        runs; they go back to the queue's tail, where their tier already stood."""
        applied = self.slo.pass_state.applied
        hold, at = applied.hold, applied.hold_at
        if not hold:
            return admit()
        held = set_aside(self.waiting_queue, hold, at)
        self.slo.views.held_to_tail(hold, at, self.waiting_queue, held)
        try:
            return admit()
        finally:
            self.waiting_queue.extend(held)  # SGLang may have rebound the list: extend the current one

    def _prefill_dynamic_chunk(self, running_batch: Any, admit: Callable[[], Any]) -> Any:
        """One PD prefill pass under dynamic chunking: the request prefilled next (the one being
        chunked, else the queue's head in the plan's order) is finished whole when B < remaining
        < 2B, alone in its step. SGLang reads `chunked_prefill_size` per pass as PrefillAdder's
        rem_chunk_tokens (max_prefill_tokens only stops further admissions once chunking is on,
        so it does not cap the step). `admit`: SGLang's own admission."""
        chunker = self.slo.chunker
        assert chunker is not None
        target = self.chunked_req if self.chunked_req is not None else next(iter(self.waiting_queue), None)

        def choose() -> ChunkStep:
            try:
                return chunker.step(None if target is None else uncached_len(target))
            except Exception:  # never let the rule take the engine down: chunk at B
                self.slo.planner.errors += 1
                logger.exception("dynamic chunking failed at step %d", self.slo.pass_state.step)
                return ChunkStep(chunker.budget, True)

        step = self.slo.sync.decide(choose, ChunkStep(chunker.budget, True))
        current = self.slo.pass_state
        self.chunked_prefill_size = step.chunk
        current.applied = replace(current.applied, solo_pass=not step.admit_others)
        try:
            out = admit()
        finally:
            self.chunked_prefill_size = chunker.budget
            current.applied = replace(current.applied, solo_pass=False)
        batch = getattr(out, "batch_to_run", None)
        whole = batch is not None and any(r is target for r in batch.reqs) and self.chunked_req is not target
        chunker.record(step, whole)
        return out
