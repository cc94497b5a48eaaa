"""How a simulated engine forms a step, as SGLang's scheduler does: a plan's drops,
preemptions, order and tiers applied to the queue; then out-of-KV retraction, the chunked
prefills in flight, admission in queue order under the batch cap, the prefill budget and free
KV, the overlap schedule's held arrivals, and the step's time from the card's pace."""

from __future__ import annotations

from scheduler.core.dynamic_chunking import dynamic_chunk
from scheduler.core.plan_path import DECODE, FinalPlan
from scheduler.core.sim_requests import Finished, RequestState, RunningStep
from scheduler.core.sim_views import SimViews


class SimBatching(SimViews):
    """The engine's step forming (see SimEngine.begin_step)."""

    def _form_step(
        self, now: float, plan: FinalPlan | None, spec_steps: int, ghosts: int, held: list[RequestState]
    ) -> float | None:
        """The batch of the step that starts at `now` under `plan` (None: not planned), SGLang's
        way: retract for KV, continue prefills, admit in order; its end time (None: empty)."""
        cfg = self.cfg
        if plan is not None and self.settings.apply_levers and self._chunk_budget is None:
            self._chunk = plan.chunk_size if plan.chunk_size is not None else cfg.chunk_size
        cap = cfg.max_running_requests if plan is None or plan.batch_cap is None else plan.batch_cap
        budget = self._chunk if plan is None or plan.chunk_size is None else plan.chunk_size
        budget = max(budget, 1) if plan is None or plan.prefill else 0
        solo = False
        if self._chunk_budget is not None:
            budget, solo = self._dynamic_chunk()
        role = self.settings.role

        # Out of KV for this step's decode tokens: retract the newest, as SGLang does.
        per_decode = 1 + spec_steps
        while self.running and self.kv_used + per_decode * self.n_decoding > cfg.total_kv_tokens:
            st = self.running[next(reversed(self.running))]
            self._leave_running(st)
            self._reset_prefill(st)
            self.waiting.insert(0, st)

        # Batch: every prefilled running request decodes; in-flight prefills continue; then admit.
        n_decode = self.n_decoding
        prefill: list[tuple[RequestState, int]] = []
        for st in self.prefilling:
            if budget <= 0:
                break
            take = min(budget, st.prefill_target - st.prefilled)
            prefill.append((st, take))
            budget -= take
        free_kv = cfg.total_kv_tokens - self.kv_used - n_decode
        parked: list[RequestState] = []  # held by the plan (lost causes while SLO work runs): not started
        if plan is not None and plan.hold:
            parked = [st for st in self.waiting if st.req.rid in plan.hold]
            self.waiting = [st for st in self.waiting if st.req.rid not in plan.hold]
        admitted = 0
        joined: list[RequestState] = []  # PD decode: admitted with their KV, decoding this step
        for st in self.waiting:
            if role == DECODE:
                if len(self.running) >= cap:
                    break
            elif budget <= 0 or len(self.running) >= cap or (solo and prefill):
                break
            context = st.req.prompt_len + st.gen_base
            if context + 1 > free_kv:
                break
            self._seq += 1
            st.admitted_seq = self._seq
            st.view_settled = False
            self.running[self._seq] = st
            admitted += 1
            free_kv -= context + 1
            if role == DECODE:  # the KV came with it: it decodes from now on
                st.prefilled = st.prefill_target = context
                self.kv_used += context
                joined.append(st)
                continue
            cached = 0
            if self.prefix is not None and st.req.prefix_hashes:
                cached = self.prefix.cached_tokens(st.req.prefix_hashes, st.req.prompt_len)
                if st.view is not None:
                    st.view.prefix_cached = cached
            st.prefilled, st.prefill_target = cached, context
            self.kv_used += cached
            self.prefilling.append(st)
            take = min(budget, context - cached)
            prefill.append((st, take))
            budget -= take
        if admitted:
            del self.waiting[:admitted]
        self.waiting.extend(parked)  # the tier runs last: their place was the queue's tail
        if held:
            self.waiting.extend(held)  # formed into the pass after this one
        if prefill and (not self.settings.mixed_batching or (plan is not None and plan.prefill_alone)):
            n_decode = 0  # separate batching, or a plan's prefill alone: every decode waits the step out
        if not n_decode and not prefill and not joined and not ghosts:
            return None

        prefill_tokens = sum(t for _, t in prefill)
        # KV attended, as the emulator and the perf model key a step: the decoders' contexts when
        # they run, and each prefill's context up to the end of this chunk. A prefill-only step
        # (separate batching) reads none of the decoders' KV.
        decoders_kv = self.kv_used - sum(st.prefilled for st in self.prefilling)
        kv = (decoders_kv if n_decode or joined else 0) + sum(st.prefilled + take for st, take in prefill)
        decodes = n_decode + len(joined) + ghosts
        if self.spec is not None and prefill and self.spec.decode_only:
            spec_steps = 0  # EAGLE's mixed step: the decodes beside a prefill do not draft
        if self.spec is not None:
            dt = self.spec.step_time(self.perf, prefill_tokens, decodes, kv, spec_steps if decodes else 0)
        else:
            dt = self.perf.step_time(prefill_tokens, decodes, kv)
        end = now + max(dt, 0.0)
        self._step = RunningStep(now, end, prefill, n_decode, joined, spec_steps)
        return end

    def _overlap_hold(self, now: float) -> tuple[int, list[RequestState]]:
        """Overlap schedule: (ghost rows in this pass, requests held out of it). Back to back
        with the previous pass, this pass was formed when that one started, so requests that
        arrived since then wait, unless nothing else would run (then the host forms the pass
        after the previous one's results, with them)."""
        fresh, self._fresh = self._fresh, []
        ghosts, self._ghosts = self._ghosts, 0
        if not self.cfg.overlap or self._last_end is None or now > self._last_end:
            return 0, []
        queued = {id(st) for st in fresh}
        held = [st for st in self.waiting if id(st) in queued]
        if not held or not (ghosts or self.running or len(held) < len(self.waiting)):
            return ghosts, []
        self.waiting = [st for st in self.waiting if id(st) not in queued]
        return ghosts, held

    def _apply(self, plan: FinalPlan, now: float, dropped: list[Finished]) -> None:
        """Drops and preemptions first, as the adapter does; then the order and the tiers."""
        if plan.drop:
            keep = []
            for st in self.waiting:
                reason = plan.drop.get(st.req.rid)
                if reason is None:
                    keep.append(st)
                    continue
                self._by_rid.pop(st.req.rid, None)
                dropped.append(Finished(st.req, self._materialise(st), now, reason, st.preemptions))
            self.waiting = keep
        if plan.preempt:
            victims = set(plan.preempt)
            for st in [s for s in self.running.values() if s.req.rid in victims]:
                self._leave_running(st)
                self._reset_prefill(st)
                self.waiting.append(st)
        for st in self.waiting:
            st.be_tier = st.req.rid in plan.best_effort
        if plan.order is not None:
            pos = {rid: i for i, rid in enumerate(plan.order)}
            last = len(pos)
            self.waiting.sort(key=lambda s: pos.get(s.req.rid, last))
        if plan.best_effort:
            self.waiting = [s for s in self.waiting if not s.be_tier] + [s for s in self.waiting if s.be_tier]

    def _dynamic_chunk(self) -> tuple[int, bool]:
        """PolyServe dynamic chunking: this step's budget and whether it finishes one request alone."""
        assert self._chunk_budget is not None
        target = self.prefilling[0] if self.prefilling else (self.waiting[0] if self.waiting else None)
        remaining = None
        if target is not None:
            remaining = (
                target.prefill_target - target.prefilled
                if target in self.prefilling
                else target.req.prompt_len + target.gen_base
            )
        step = dynamic_chunk(self._chunk_budget, remaining, 1, self._startup_chunk)
        return step.chunk, not step.admit_others
