"""One simulated engine, stepped from outside: the unit both simulators are built from.

Why a steppable engine: the single-engine `Simulator` and the cluster simulator (benchmarks/
simulator) must run engines identically, and a cluster interleaves hundreds of them with a
router in one event loop. `SimEngine.begin_step(now)` decides a step the way the SGLang adapter
does (a plan only while the waiting queue is non-empty, finished on the one plan path, then
drops, preemptions, order, tiers, batch cap, chunk and prefill gate applied with SGLang-like
continuous batching and chunked prefill) and returns when it ends; `end_step()` emits its
tokens and reports what finished. Requests may be added or removed between the two.

Cost: hundreds of engines for minutes of traffic means millions of steps, so a step costs
O(1) plus O(requests it starts, finishes or prefills), never O(running): a decoding request
gains one token in every decode step while it runs, so its token count, KV and attained
service follow from the engine's decode-step counter (`RequestState.seg_start`), and its finish step
is known when it starts decoding (a heap). Views are built only when a plan is asked for.
Speculative decoding (a `Speculation` hook) gives each request a random number of tokens per
step and takes the per-request path instead.

`EngineConfig.overlap` models SGLang's overlap schedule (on by default on GPUs): pass N+1 is
formed and launched while pass N runs, before N's outputs are known. So a request that arrives
during a pass waits for the pass after the next one (one pass more than without overlap; this
was the simulator's TTFT gap against the emulated server), and a request that finishes in pass N
still decodes, uselessly, in pass N+1 (a "ghost" row, also the one trailing pass after the last
request ends). When pass N+1 would be empty the host forms the next one as soon as N's results
are in, so nothing is held back then.

The true output length is known only here; views expose what a server would.
"""

from __future__ import annotations

import heapq

from scheduler.core.plan_path import PREFILL, FinalPlan, plan_pass
from scheduler.core.sim_batching import SimBatching

# The engine's vocabulary, re-exported (`X as X`): the cluster simulator (benchmarks/simulator)
# takes the engine and what it is given and reports from this one module.
from scheduler.core.sim_requests import KV_TOO_LARGE as KV_TOO_LARGE
from scheduler.core.sim_requests import PREFILLED as PREFILLED
from scheduler.core.sim_requests import EngineConfig as EngineConfig
from scheduler.core.sim_requests import Finished, RequestState, SimRequest, StepOutcome
from scheduler.core.sim_requests import Speculation as Speculation


class SimEngine(SimBatching):
    """One engine. `policy` plans with `plan_perf` (the server's model); steps last what `perf`
    (the card's pace) says. `settings` is how the engine finishes plans (batching mode, role).
    Its rooms: the state and token bookkeeping (sim_ledger.SimLedger, with the constructor),
    the views (sim_views.SimViews), forming a step (sim_batching.SimBatching); here the queue
    and the step loop."""

    # ---- queue -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def busy(self) -> bool:
        return self._step is not None

    @property
    def has_work(self) -> bool:
        """A step would run now: requests here, or (overlap) last step's finished rows still decoding."""
        return bool(self.waiting or self.running or self._ghosts)

    def add(self, req: SimRequest) -> str | None:
        """Queue a request; returns a drop reason when it can never fit (SGLang rejects it)."""
        st = RequestState(req, gen_base=req.generated)
        if req.prompt_len + req.generated + 1 > self.cfg.total_kv_tokens:
            return KV_TOO_LARGE
        self.waiting.append(st)
        self._by_rid[req.rid] = st
        if self.cfg.overlap:
            self._fresh.append(st)
        return None

    def remove(self, rid: str) -> tuple[SimRequest, list[float]] | None:
        """Take a request away (migration, abort): its tokens so far. A request in the step now
        running leaves at the step's end, its tokens from that step discarded."""
        st = self._by_rid.pop(rid, None)
        if st is None:
            return None
        tokens = self.tokens_of(st)
        if st.admitted_seq not in self.running or self.running[st.admitted_seq] is not st:
            self.waiting = [s for s in self.waiting if s is not st]
        elif self._step is not None:
            st.removed = True
            self._removed.append(st)
        else:
            self._leave_running(st)
        return st.req, tokens

    def take_dropped(self) -> list[Finished]:
        """Requests the last plan dropped (queue timeouts, admission drops), now gone."""
        out, self._dropped = self._dropped, []
        if self.lengths is not None:
            for f in out:
                self.lengths.forget(f.req.rid)
        return out

    # ---- one step ----------------------------------------------------------------------------
    def begin_step(self, now: float) -> float | None:
        """Decide and start the next step at `now`; its end time, or None when nothing can run
        (then the engine waits for the next arrival). What the plan dropped: `take_dropped()`."""
        assert self._step is None, "a step is already running"
        dropped = self._dropped
        ghosts, held = self._overlap_hold(now)
        plan: FinalPlan | None = None
        spec_steps = self.spec.steps() if self.spec is not None else 0
        if self.waiting or self.prefilling:  # as the adapter: a chunked prefill's next chunk is planned
            view = self.view(now)
            levers = self.spec.lever_model(self.plan_perf) if self.spec is not None else self.lever_model
            plan = plan_pass(view, self.policy, self.settings, levers, cache=self._row_cache, fair=self._fair)
            if plan.preempt or plan.drop:
                self.plans.append((self.steps, plan))
            if self.record_trace:
                self.trace.append((view, plan))
            self._apply(plan, now, dropped)
        if self.spec is not None and self.running:
            self.spec.update(self.view(now), self.plan_perf)
            spec_steps = self.spec.steps()
        return self._form_step(now, plan, spec_steps, ghosts, held)

    def end_step(self) -> StepOutcome:
        """Emit the running step's tokens at its end and report what finished."""
        step, self._step = self._step, None
        assert step is not None, "no step is running"
        t = step.end
        self.steps += 1
        self._last_end = t
        finished: list[Finished] = []
        first: list[tuple[SimRequest, float]] = []
        emitted = 0
        done: list[RequestState] = []
        for st in step.joined:  # PD decode: the prefill's first token reaches the client now
            st.pieces.append(step.start)
            st.emitted += 1
            if st.first_token_time is None:
                st.first_token_time = step.start
                first.append((st.req, step.start))
            emitted += 1
            self._start_decoding(st, done)  # and it decodes in this very step
        decodes = step.decodes + len(step.joined)
        decode_tokens = decodes
        if self.spec is not None:
            decode_tokens = self._spec_decode(step, t, done)
            emitted += decode_tokens
        elif decodes:
            self.decode_times.append(t)
            self.kv_used += decodes
            emitted += decodes
            index = len(self.decode_times) - 1
            heap = self._finish_at
            while heap and heap[0][0] <= index:
                _, _, epoch, st = heapq.heappop(heap)
                if st.epoch == epoch and st.decoding:
                    done.append(st)
        completed = False
        for st, take in step.prefill:
            st.prefilled += take
            key = st.key
            self._attained[key] = self._attained.get(key, 0.0) + take
            self.kv_used += take
            if st.needs_prefill:
                continue
            completed = True
            if self.prefix is not None and st.req.prefix_hashes:
                self.prefix.insert(st.req.prefix_hashes)
            st.gen_base += 1
            st.pieces.append(t)
            st.emitted += 1
            self.kv_used += 1
            emitted += 1
            if st.first_token_time is None:
                st.first_token_time = t
                if not st.removed:
                    first.append((st.req, t))
            if self.settings.role == PREFILL:
                done.append(st)
            else:
                self._start_decoding(st, done)
        if completed:
            self.prefilling = [s for s in self.prefilling if s.needs_prefill]
        done.sort(key=lambda s: s.admitted_seq)
        reason = PREFILLED if self.settings.role == PREFILL else None
        if self.cfg.overlap and reason is None:
            self._ghosts = sum(1 for st in done if not st.removed)  # the next pass was formed with them
        for st in done:
            if st.removed:
                continue
            tokens = self._materialise(st)
            self._leave_running(st)
            self._by_rid.pop(st.req.rid, None)
            finished.append(Finished(st.req, tokens, t, reason, st.preemptions))
            if self.lengths is not None:
                if reason is None:  # answered in full: its length teaches an online predictor
                    self.lengths.finished(st.req.rid, st.req.slo.program_id, st.req.output_len)
                else:
                    self.lengths.forget(st.req.rid)
        if self._removed:
            for st in self._removed:
                self._leave_running(st)
            self._removed = []
        return StepOutcome(t, step.start, finished, first, decodes, emitted, decode_tokens)
