"""One simulated engine, stepped from outside: the unit both simulators are built from.

Why a steppable engine: the single-engine `Simulator` and the cluster simulator (benchmarks/
cluster) must run engines identically, and a cluster interleaves hundreds of them with a
router in one event loop. `SimEngine.begin_step(now)` decides a step the way the SGLang adapter
does (a plan only while the waiting queue is non-empty, finished on the one plan path, then
drops, preemptions, order, tiers, batch cap, chunk and prefill gate applied with SGLang-like
continuous batching and chunked prefill) and returns when it ends; `end_step()` emits its
tokens and reports what finished. Requests may be added or removed between the two.

Cost: hundreds of engines for minutes of traffic means millions of steps, so a step costs
O(1) plus O(requests it starts, finishes or prefills), never O(running): a decoding request
gains one token in every decode step while it runs, so its token count, KV and attained
service follow from the engine's decode-step counter (`_State.seg_start`), and its finish step
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

import functools
import heapq
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.columns import RowCache
from scheduler.core.dynamic_chunking import budget_from_startup, dynamic_chunk
from scheduler.core.fairness import FairShare
from scheduler.core.plan_path import DECODE, PREFILL, FinalPlan, KnobModel, PlanSettings, plan_pass
from scheduler.core.policies.oracle import ORACLE_SUFFIX
from scheduler.core.slo import SloSpec
from scheduler.core.types import EngineView, PerfModel, Policy, RequestView

KV_TOO_LARGE = "kv_too_large"
PREFILLED = "prefilled"  # a PD prefill engine's hand-off: the first token exists, decoding goes elsewhere


@dataclass
class SimRequest:
    """A workload item: what the client sends plus the true output length (hidden)."""

    rid: str
    slo: SloSpec
    arrival: float
    prompt_len: int
    output_len: int  # true length; never shown to the policy
    max_new_tokens: int | None = None
    predicted_output_len: float | None = None
    program_arrival: float | None = None
    stage_deadline: float | None = None
    parents: tuple[str, ...] = ()  # rids that must finish first: it arrives think_s after the last
    think_s: float = 0.0
    generated: int = 0  # output tokens it arrives with (a PD decode engine's hand-off)
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of its prompt's leading blocks (prefix reuse)
    tenant: str | None = None  # the API key it came with (fair shares between keys)
    share: float = 1.0  # that key's share


@dataclass
class EngineConfig:
    max_running_requests: int = 8
    chunk_size: int = 512
    total_kv_tokens: int = 1 << 20
    prefix_block_tokens: int = 0  # > 0: a prefix cache of blocks this size (requests' prefix_hashes)
    overlap: bool = False  # SGLang's overlap schedule: the next pass is formed while this one runs


class PrefixCache:
    """The engine's radix cache, as far as a simulator needs it: which leading prompt blocks were
    computed here recently (an LRU bounded by the KV capacity). An admitted request's matched
    blocks are not prefilled again; the cache's own KV is not counted against admissions."""

    def __init__(self, block_tokens: int, max_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max(1, max_blocks)
        self._lru: dict[int, None] = {}

    def cached_tokens(self, hashes: Sequence[int], prompt_len: int) -> int:
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return min(n * self.block_tokens, max(prompt_len - 1, 0))  # the last token is always computed

    def insert(self, hashes: Sequence[int]) -> None:
        lru = self._lru
        for h in hashes:
            lru.pop(h, None)
            lru[h] = None
        while len(lru) > self.max_blocks:
            del lru[next(iter(lru))]


class Speculation(Protocol):
    """Speculative decoding on one engine: the drafting length, its cost and its acceptance."""

    def steps(self) -> int:
        """Drafted tokens per decoding request in the next decode step (0: no speculation)."""
        ...

    def knob_model(self, plan_perf: PerfModel) -> KnobModel:
        """What the default knobs are sized with at the current length."""
        ...

    def step_time(self, pace: PerfModel, prefill_tokens: int, decodes: int, kv_tokens: int, steps: int) -> float:
        """Seconds of one step: the verify pass plus the draft passes."""
        ...

    def accept(self, decodes: int, steps: int) -> Sequence[int]:
        """Accepted drafts per decoding request of a verify (and learn from them)."""
        ...

    def update(self, view: EngineView, plan_perf: PerfModel) -> None:
        """Re-decide the length for the running requests (every pass, as the adapter does)."""
        ...


@dataclass(eq=False)
class _State:
    req: SimRequest
    gen_base: int = 0  # tokens generated up to the current decode segment's start
    prefill_target: int = 0  # context to (re)compute on admission: prompt + tokens so far
    prefilled: int = 0  # progress towards prefill_target
    first_token_time: float | None = None
    pieces: list[float | tuple[int, int]] = field(default_factory=list)  # token times: one, or a decode-step range
    emitted: int = 0  # token times in `pieces`
    admitted_seq: int = 0
    preemptions: int = 0
    be_tier: bool = False
    decoding: bool = False  # running, prefilled: gains a token in every decode step
    seg_start: int = 0  # the engine's decode-step index where the current decode segment began
    epoch: int = 0  # bumped when a decode segment ends: stale finish-heap entries are skipped
    removed: bool = False  # taken away mid-step (migration): dropped silently at the step's end
    key: str = ""  # whose attained service it counts towards: its program, else itself
    view: RequestView | None = None
    view_settled: bool = False  # its view cannot change while it waits (refreshed since it last ran)

    def __post_init__(self) -> None:
        self.key = self.req.slo.program_id or self.req.rid

    @property
    def needs_prefill(self) -> bool:
        return self.prefilled < self.prefill_target


@dataclass
class Finished:
    """A request that left the engine: finished (`reason` None), dropped, or handed off."""

    req: SimRequest
    token_times: list[float]
    time: float
    reason: str | None
    preemptions: int


@dataclass
class StepOutcome:
    """What one step did, for the caller's bookkeeping (load reports, records)."""

    end: float
    start: float
    finished: list[Finished]
    first_tokens: list[tuple[SimRequest, float]]  # requests whose first token this step emitted
    decodes: int  # requests that decoded in this step
    emitted: int  # output tokens emitted
    decode_tokens: int = 0  # of which by decoding requests (speculation: 1 + accepted drafts each)


def _bound(lengths: LiveLengthBounds, r: SimRequest, generated: int) -> float | None:
    return lengths.bound(r.rid, str, r.prompt_len, r.slo.program_id, generated)


class SimEngine:
    """One engine. `policy` plans with `plan_perf` (the server's model); steps last what `perf`
    (the card's pace) says. `settings` is how the engine finishes plans (batching mode, role)."""

    def __init__(
        self,
        policy: Policy,
        perf: PerfModel,
        config: EngineConfig,
        settings: PlanSettings,
        plan_perf: PerfModel | None = None,
        predictor: Callable[[SimRequest, int], float | None] | None = None,
        record_trace: bool = False,
        speculation: Speculation | None = None,
        startup_chunk: int | None = None,
        lengths: LiveLengthBounds | None = None,
    ) -> None:
        if lengths is not None:
            if predictor is not None:
                raise ValueError("give a predictor or length bounds, not both")
            predictor = functools.partial(_bound, lengths)
        self.lengths = lengths  # as the server's --slo-length-predictor: answered requests teach it
        self.policy = policy
        # benchmarks' *_oracle policies only are shown the true length, as the adapter does
        self.oracle = policy.name.endswith(ORACLE_SUFFIX)
        self.perf = perf
        self.plan_perf = plan_perf if plan_perf is not None else perf
        self.cfg = config
        self.settings = settings
        self.predictor = predictor
        self.record_trace = record_trace
        self.spec = speculation
        self.knob_model = KnobModel(self.plan_perf)
        # A state's view keeps RowCache's contract (only per-pass fields are refreshed); a
        # recorded trace builds new views every pass, which a cache would only pile up.
        self._row_cache = None if record_trace else RowCache()
        self._fair = FairShare()  # tenants' served-token counters across passes (fair shares)
        self.waiting: list[_State] = []
        self.running: dict[int, _State] = {}  # admitted_seq -> state: admission order, O(1) removal
        self.prefilling: list[_State] = []  # running requests still prefilling, in admission order
        self.kv_used = 0  # KV tokens held by running requests
        self.n_decoding = 0
        self.decode_times = array("d")  # end time of every step that decoded
        self.steps = 0
        self.plans: list[tuple[int, FinalPlan]] = []  # plans that preempted or dropped
        self.trace: list[tuple[EngineView, FinalPlan]] = []
        self._finish_at: list[tuple[int, int, int, _State]] = []  # (decode index, seq, epoch, state)
        self._attained: dict[str, float] = {}  # program (or rid) -> tokens served, decode segments folded in
        self._by_rid: dict[str, _State] = {}
        self._seq = 0
        self._chunk = config.chunk_size  # the adapter keeps the last plan's chunk for passes it does not plan
        # PD prefill under an SLO policy: PolyServe dynamic chunking (started at 2B, normal steps at B)
        dynamic = settings.role == PREFILL and settings.knobs and startup_chunk
        self._chunk_budget = budget_from_startup(startup_chunk) if dynamic and startup_chunk else None
        self._startup_chunk = startup_chunk
        self._step: _Step | None = None
        self.prefix = (
            PrefixCache(config.prefix_block_tokens, config.total_kv_tokens // config.prefix_block_tokens)
            if config.prefix_block_tokens > 0
            else None
        )
        self._dropped: list[Finished] = []  # the last plan's drops, until the caller takes them
        self._removed: list[_State] = []  # taken away while in the running step
        # overlap schedule: requests queued since the last begin_step, rows finished in the last step
        self._fresh: list[_State] = []
        self._ghosts = 0
        self._last_end: float | None = None

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
        st = _State(req, gen_base=req.generated)
        if req.prompt_len + req.generated + 1 > self.cfg.total_kv_tokens:
            return KV_TOO_LARGE
        self.waiting.append(st)
        self._by_rid[req.rid] = st
        if self.cfg.overlap:
            self._fresh.append(st)
        return None

    def generated(self, st: _State) -> int:
        return st.gen_base + (len(self.decode_times) - st.seg_start if st.decoding else 0)

    def emitted(self, rid: str) -> int | None:
        """Tokens this engine has emitted for `rid` so far (None: not here)."""
        st = self._by_rid.get(rid)
        if st is None:
            return None
        return st.emitted + (len(self.decode_times) - st.seg_start if st.decoding else 0)

    def tokens(self, rid: str) -> list[float] | None:
        """Token times this engine has emitted for `rid` so far (None: not here)."""
        st = self._by_rid.get(rid)
        return None if st is None else self.tokens_of(st)

    def tokens_of(self, st: _State) -> list[float]:
        """Token times so far (decode segments materialised from the engine's step times)."""
        out: list[float] = []
        times = self.decode_times
        for p in st.pieces:
            if isinstance(p, tuple):
                out.extend(times[p[0] : p[1]])
            else:
                out.append(p)
        if st.decoding and len(times) > st.seg_start:
            out.extend(times[st.seg_start :])
        return out

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
        cfg = self.cfg
        dropped = self._dropped
        ghosts, held = self._overlap_hold(now)
        plan: FinalPlan | None = None
        spec_steps = self.spec.steps() if self.spec is not None else 0
        if self.waiting or self.prefilling:  # as the adapter: a chunked prefill's next chunk is planned
            view = self.view(now)
            knobs = self.spec.knob_model(self.plan_perf) if self.spec is not None else self.knob_model
            plan = plan_pass(view, self.policy, self.settings, knobs, cache=self._row_cache, fair=self._fair)
            if plan.preempt or plan.drop:
                self.plans.append((self.steps, plan))
            if self.record_trace:
                self.trace.append((view, plan))
            self._apply(plan, now, dropped)
        if self.spec is not None and self.running:
            self.spec.update(self.view(now), self.plan_perf)
            spec_steps = self.spec.steps()
        if plan is not None and self.settings.knobs and self._chunk_budget is None:
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
        prefill: list[tuple[_State, int]] = []
        for st in self.prefilling:
            if budget <= 0:
                break
            take = min(budget, st.prefill_target - st.prefilled)
            prefill.append((st, take))
            budget -= take
        free_kv = cfg.total_kv_tokens - self.kv_used - n_decode
        parked: list[_State] = []  # held by the plan (lost causes while SLO work runs): not started
        if plan is not None and plan.hold:
            parked = [st for st in self.waiting if st.req.rid in plan.hold]
            self.waiting = [st for st in self.waiting if st.req.rid not in plan.hold]
        admitted = 0
        joined: list[_State] = []  # PD decode: admitted with their KV, decoding this step
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
        if prefill and not self.settings.mixed_batching:
            n_decode = 0  # separate batching: a prefill step runs alone, every decode waits
        if not n_decode and not prefill and not joined and not ghosts:
            return None

        prefill_tokens = sum(t for _, t in prefill)
        # KV attended, as the emulator and the perf model key a step: the decoders' contexts when
        # they run, and each prefill's context up to the end of this chunk. A prefill-only step
        # (separate batching) reads none of the decoders' KV.
        decoders_kv = self.kv_used - sum(st.prefilled for st in self.prefilling)
        kv = (decoders_kv if n_decode or joined else 0) + sum(st.prefilled + take for st, take in prefill)
        decodes = n_decode + len(joined) + ghosts
        if self.spec is not None:
            dt = self.spec.step_time(self.perf, prefill_tokens, decodes, kv, spec_steps if decodes else 0)
        else:
            dt = self.perf.step_time(prefill_tokens, decodes, kv)
        end = now + max(dt, 0.0)
        self._step = _Step(now, end, prefill, n_decode, joined, spec_steps)
        return end

    def _overlap_hold(self, now: float) -> tuple[int, list[_State]]:
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
        done: list[_State] = []
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

    # ---- views -------------------------------------------------------------------------------
    def view(self, now: float) -> EngineView:
        """What the policy sees now: every waiting and running request, engine limits."""
        live = self._live_service()
        return EngineView(
            now=now,
            waiting=[self._waiting_view(st, live) for st in self.waiting],
            running=self._running_views(live),
            max_running_requests=self.cfg.max_running_requests,
            chunk_size=self.cfg.chunk_size,
            free_kv_tokens=self.cfg.total_kv_tokens - self.kv_used,
            total_kv_tokens=self.cfg.total_kv_tokens,
            step=self.steps,
        )

    def _live_service(self) -> dict[str, int]:
        """Decode tokens of the running segments, per key: what `_attained` has not folded in yet."""
        live: dict[str, int] = {}
        n = len(self.decode_times)
        for st in self.running.values():
            if st.decoding:
                key = st.key
                live[key] = live.get(key, 0) + n - st.seg_start
        return live

    def _waiting_view(self, st: _State, live: dict[str, int]) -> RequestView:
        """A waiting request's view; one that has not run since its last refresh, counts its
        service alone (no program) and has no predictor to re-ask, only changes its tier."""
        view = st.view
        if st.view_settled and view is not None:
            view.best_effort_tier = st.be_tier
            return view
        view = self._view(st, live)
        st.view_settled = st.key == st.req.rid and self.predictor is None and not self.record_trace
        return view

    def _running_views(self, live: dict[str, int]) -> list[RequestView]:
        """Running requests' views: `_view`'s refresh inlined, since it runs for every running
        request at every planned step (what changes: tokens, service, the first token)."""
        if self.record_trace or self.predictor is not None:
            return [self._view(st, live) for st in self.running.values()]
        n = len(self.decode_times)
        attained = self._attained
        out = []
        for st in self.running.values():
            view = st.view
            if view is None:
                out.append(self._view(st, live))
                continue
            view.generated = st.gen_base + (n - st.seg_start if st.decoding else 0)
            view.first_token_time = st.first_token_time
            view.attained_service = attained.get(st.key, 0.0) + live.get(st.key, 0)
            view.best_effort_tier = st.be_tier
            out.append(view)
        return out

    def _view(self, st: _State, live: dict[str, int]) -> RequestView:
        r = st.req
        key = st.key
        generated = self.generated(st)
        attained = self._attained.get(key, 0.0) + live.get(key, 0)
        predicted = r.predicted_output_len
        if self.predictor is not None:
            predicted = self.predictor(r, generated)
        view = st.view
        if view is None or self.record_trace:  # a recorded trace keeps each step's own views
            view = RequestView(
                rid=r.rid,
                slo=r.slo,
                arrival=r.arrival,
                prompt_len=r.prompt_len,
                generated=generated,
                max_new_tokens=r.max_new_tokens,
                predicted_output_len=predicted,
                first_token_time=st.first_token_time,
                prefix_cached=self.prefix.cached_tokens(r.prefix_hashes, r.prompt_len)
                if self.prefix is not None and r.prefix_hashes
                else 0,
                program_arrival=r.program_arrival,
                stage_deadline=r.stage_deadline,
                attained_service=attained,
                best_effort_tier=st.be_tier,
                oracle_output_len=r.output_len if self.oracle else None,
                tenant=r.tenant,
                share=r.share,
            )
            if not self.record_trace:
                st.view = view
            return view
        # Kept across passes, as the adapter keeps them: a policy must not hold one beyond plan().
        view.generated = generated
        view.predicted_output_len = predicted
        view.first_token_time = st.first_token_time
        view.attained_service = attained
        view.best_effort_tier = st.be_tier
        return view

    # ---- internals ---------------------------------------------------------------------------
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

    def _start_decoding(self, st: _State, done: list[_State]) -> None:
        """`st` now holds its first (or resumed) token: it decodes from the next decode step on."""
        if st.gen_base >= st.req.output_len:
            done.append(st)
            return
        st.decoding = True
        st.seg_start = len(self.decode_times)
        self.n_decoding += 1
        if self.spec is None:
            finish_index = st.seg_start + st.req.output_len - st.gen_base - 1
            heapq.heappush(self._finish_at, (finish_index, st.admitted_seq, st.epoch, st))

    def _end_segment(self, st: _State) -> None:
        if not st.decoding:
            return
        n = len(self.decode_times)
        gained = n - st.seg_start
        if gained > 0:
            st.pieces.append((st.seg_start, n))
            st.emitted += gained
            st.gen_base += gained
            key = st.key
            self._attained[key] = self._attained.get(key, 0.0) + gained
        st.decoding = False
        st.epoch += 1
        self.n_decoding -= 1

    def _materialise(self, st: _State) -> list[float]:
        self._end_segment(st)
        return self.tokens_of(st)

    def _leave_running(self, st: _State) -> None:
        """Out of the running batch (finished, preempted, retracted, removed): its KV is freed."""
        if self.running.pop(st.admitted_seq, None) is None:
            return
        context = st.req.prompt_len + self.generated(st)
        self.kv_used -= context if not st.needs_prefill else st.prefilled
        self._end_segment(st)
        if st.needs_prefill:
            self.prefilling = [s for s in self.prefilling if s is not st]

    def _reset_prefill(self, st: _State) -> None:
        """Preempted or retracted: it keeps its tokens and recomputes its KV when resumed."""
        st.prefilled = st.prefill_target = 0
        st.preemptions += 1

    def _spec_decode(self, step: _Step, t: float, done: list[_State]) -> int:
        """Speculative decode: each decoding request gains 1 + its accepted drafts (at most what
        is left of its answer), all at the step's end."""
        assert self.spec is not None
        joined = {id(s) for s in step.joined}
        decoding = [st for st in self.running.values() if st.decoding and id(st) not in joined]
        if not step.decodes or not decoding:
            return 0
        steps = step.spec_steps
        accepted = self.spec.accept(len(decoding), steps) if steps > 0 else [0] * len(decoding)
        emitted = 0
        for st, extra in zip(decoding, accepted):
            k = min(1 + int(extra), st.req.output_len - st.gen_base)
            st.gen_base += k
            st.pieces.extend([t] * k)
            st.emitted += k
            self.kv_used += k
            key = st.key
            self._attained[key] = self._attained.get(key, 0.0) + k
            emitted += k
            if st.gen_base >= st.req.output_len:
                done.append(st)
        return emitted


@dataclass
class _Step:
    """A step between begin_step and end_step."""

    start: float
    end: float
    prefill: list[tuple[_State, int]]
    decodes: int  # running requests decoding in it (PD decode: besides those joining now)
    joined: list[_State]  # PD decode: admitted with their KV, decoding from this step on
    spec_steps: int
