"""A single-engine, virtual-time simulator that runs any Policy the way the adapter would.

Why: policies must be compared and tested on exact, repeatable schedules without a GPU. Each
iteration the simulator builds an EngineView, asks the policy for a StepPlan and finishes it on
the same plan path as the SGLang adapter (scheduler/core/plan_path.py: queue-timeout drops,
default batch knobs, guards), applies it (drop, preempt, order, best_effort, batch_cap,
chunk_size) with SGLang-like continuous batching and chunked prefill, charges the iteration
`perf.step_time(...)` seconds on a ManualClock, and emits one token per decoding request (the
iteration that finishes a prefill emits the first).
Preempted requests keep their tokens and recompute their KV when resumed, like SGLang's retract.
The true output length is known only to the simulator; views expose what a server would.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from scheduler.core.clock import ManualClock
from scheduler.core.estimates import absolute_deadline, deadline_seconds
from scheduler.core.outcome import SloOutcome, evaluate
from scheduler.core.plan_path import FinalPlan, KnobModel, PlanSettings, finalize_plan, settings_for
from scheduler.core.slo import SloSpec
from scheduler.core.types import EngineView, PerfModel, Policy, RequestView


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


@dataclass
class _State:
    req: SimRequest
    generated: int = 0
    prefill_target: int = 0  # context to (re)compute on admission: prompt + tokens so far
    prefilled: int = 0  # progress towards prefill_target
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    admitted_seq: int = 0
    preemptions: int = 0
    be_tier: bool = False

    @property
    def context(self) -> int:
        return self.req.prompt_len + self.generated

    @property
    def needs_prefill(self) -> bool:
        return self.prefilled < self.prefill_target

    @property
    def kv(self) -> int:
        return self.prefilled if self.needs_prefill else self.context


@dataclass
class SimRecord:
    req: SimRequest
    token_times: list[float]
    finish_time: float | None  # None: dropped or unfinished when the run stopped
    drop_reason: str | None
    preemptions: int

    @property
    def finished(self) -> bool:
        return self.finish_time is not None

    def outcome(self, end_time: float) -> SloOutcome:
        r = self.req
        due = absolute_deadline(deadline_seconds(r.slo), r.arrival, r.program_arrival, r.stage_deadline)
        finish = self.finish_time if self.finish_time is not None else end_time
        return evaluate(r.slo, r.arrival, self.token_times, finish, self.finished, due)


@dataclass
class SimResult:
    records: dict[str, SimRecord]
    end_time: float
    steps: int
    plans: list[tuple[int, FinalPlan]]  # (step, plan) for plans that preempted or dropped
    trace: list[tuple[EngineView, FinalPlan]] = field(default_factory=list)  # every step, if recorded

    def outcomes(self) -> dict[str, SloOutcome]:
        return {rid: rec.outcome(self.end_time) for rid, rec in self.records.items()}


@dataclass
class EngineConfig:
    max_running_requests: int = 8
    chunk_size: int = 512
    total_kv_tokens: int = 1 << 20


class _Arrivals:
    """Requests not yet arrived: open-loop ones at their arrival time, and dependent ones (a
    program's later stages) think_s after their last parent finishes; a stage whose parent never
    finished never arrives."""

    def __init__(self, requests: Iterable[SimRequest]) -> None:
        self._heap: list[tuple[float, str, SimRequest]] = []
        self._blocked: dict[str, SimRequest] = {}
        self._waiting_on: dict[str, set[str]] = {}
        self._children: dict[str, list[str]] = {}
        self._parent_end: dict[str, float] = {}
        for r in requests:
            if r.parents:
                self._blocked[r.rid] = r
                self._waiting_on[r.rid] = set(r.parents)
                for p in r.parents:
                    self._children.setdefault(p, []).append(r.rid)
            else:
                heapq.heappush(self._heap, (r.arrival, r.rid, r))

    def due(self, now: float) -> list[SimRequest]:
        out = []
        while self._heap and self._heap[0][0] <= now + 1e-12:
            out.append(heapq.heappop(self._heap)[2])
        return out

    def next_time(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def finished(self, rid: str, t: float | None) -> None:
        """`rid` ended at `t` (None: without finishing, so its dependents never arrive)."""
        for child in self._children.pop(rid, ()):
            req = self._blocked.get(child)
            if req is None:
                continue
            if t is None:
                continue  # stays blocked: reported as never arrived
            end = max(self._parent_end.get(child, t), t)
            self._parent_end[child] = end
            self._waiting_on[child].discard(rid)
            if not self._waiting_on[child]:
                del self._blocked[child], self._waiting_on[child]
                release = end + req.think_s
                heapq.heappush(self._heap, (release, child, replace(req, arrival=release)))

    def never_arrived(self) -> list[SimRequest]:
        return [r for _, _, r in self._heap] + list(self._blocked.values())


class Simulator:
    """Run `policy` over `requests` on one engine; `predictor` may refine predicted lengths.
    `record_trace` keeps every step's view and finished plan (for comparing plan paths);
    `plan_perf` is the model the engine's default knobs are sized with (the server's perf model,
    which may differ from the steps' real times, `perf`)."""

    def __init__(
        self,
        policy: Policy,
        perf: PerfModel,
        config: EngineConfig | None = None,
        clock: ManualClock | None = None,
        predictor: Callable[[SimRequest, int], float | None] | None = None,
        settings: PlanSettings | None = None,
        record_trace: bool = False,
        plan_perf: PerfModel | None = None,
    ) -> None:
        self.policy = policy
        self.perf = perf
        self.plan_perf = plan_perf if plan_perf is not None else perf  # what the default knobs are sized with
        self.cfg = config or EngineConfig()
        self.clock = clock or ManualClock()
        self.predictor = predictor
        self.settings = settings if settings is not None else settings_for(policy)
        self.record_trace = record_trace

    def run(self, requests: Iterable[SimRequest], max_steps: int = 1_000_000, until: float | None = None) -> SimResult:
        arrivals = _Arrivals(requests)
        records: dict[str, SimRecord] = {}
        waiting: list[_State] = []
        running: list[_State] = []
        attained: dict[str, float] = {}
        plans: list[tuple[int, FinalPlan]] = []
        trace: list[tuple[EngineView, FinalPlan]] = []
        knob_model = KnobModel(self.plan_perf)
        mixed = self.settings.mixed_batching
        seq = 0
        step = 0
        cfg = self.cfg

        def finish(st: _State, t: float | None, reason: str | None) -> None:
            records[st.req.rid] = SimRecord(st.req, st.token_times, t, reason, st.preemptions)
            arrivals.finished(st.req.rid, t)

        while step < max_steps:
            now = self.clock.now()
            if until is not None and now >= until:
                break
            for req in arrivals.due(now):
                st = _State(req)
                if st.context + 1 > cfg.total_kv_tokens:
                    finish(st, None, "kv_too_large")  # could never fit, as SGLang rejects it
                else:
                    waiting.append(st)
            if not waiting and not running:
                nxt = arrivals.next_time()
                if nxt is None:
                    break
                self.clock.set(max(now, nxt))
                continue

            used = sum(s.kv for s in running)
            view = EngineView(
                now=now,
                waiting=[self._view(s, attained) for s in waiting],
                running=[self._view(s, attained) for s in running],
                max_running_requests=cfg.max_running_requests,
                chunk_size=cfg.chunk_size,
                free_kv_tokens=cfg.total_kv_tokens - used,
                total_kv_tokens=cfg.total_kv_tokens,
                step=step,
            )
            plan = finalize_plan(view, self.policy.plan(view), self.settings, knob_model)
            if plan.preempt or plan.drop:
                plans.append((step, plan))
            if self.record_trace:
                trace.append((view, plan))

            # Drops and preemptions first, as the adapter does.
            if plan.drop:
                for s in [s for s in waiting if s.req.rid in plan.drop]:
                    finish(s, None, plan.drop[s.req.rid])
                waiting = [s for s in waiting if s.req.rid not in plan.drop]
            if plan.preempt:
                victims = set(plan.preempt)
                for s in [s for s in running if s.req.rid in victims]:
                    s.prefilled = s.prefill_target = 0
                    s.preemptions += 1
                    waiting.append(s)
                running = [s for s in running if s.req.rid not in victims]

            waiting = self._ordered(waiting, plan)
            cap = cfg.max_running_requests if plan.batch_cap is None else plan.batch_cap
            budget = cfg.chunk_size if plan.chunk_size is None else plan.chunk_size
            budget = max(budget, 1) if plan.prefill else 0

            # Out of KV for this iteration's decode tokens: retract the newest, as SGLang does.
            used = sum(s.kv for s in running)
            while running and used + sum(not s.needs_prefill for s in running) > cfg.total_kv_tokens:
                s = max(running, key=lambda x: x.admitted_seq)
                running.remove(s)
                used -= s.kv
                s.prefilled = s.prefill_target = 0
                s.preemptions += 1
                waiting.insert(0, s)

            # Batch: every prefilled running request decodes; in-flight prefills continue; then admit.
            decoding = [s for s in running if not s.needs_prefill]
            prefill: list[tuple[_State, int]] = []
            for s in running:
                if s.needs_prefill and budget > 0:
                    take = min(budget, s.prefill_target - s.prefilled)
                    prefill.append((s, take))
                    budget -= take
            free_kv = cfg.total_kv_tokens - used - len(decoding)
            admitted: list[_State] = []
            for s in waiting:
                if budget <= 0 or len(running) + len(admitted) >= cap:
                    break
                if s.context + 1 > free_kv:
                    break
                take = min(budget, s.context)
                seq += 1
                s.admitted_seq = seq
                s.prefilled, s.prefill_target = 0, s.context
                prefill.append((s, take))
                admitted.append(s)
                budget -= take
                free_kv -= s.context + 1
            gone = {id(s) for s in admitted}
            waiting = [s for s in waiting if id(s) not in gone]
            running.extend(admitted)
            if prefill and not mixed:
                decoding = []  # separate batching: a prefill step runs alone, every decode waits

            if not decoding and not prefill:
                nxt = arrivals.next_time()
                if nxt is not None:
                    self.clock.set(max(now, nxt))
                    continue
                break  # nothing can ever run (e.g. the policy capped the batch at zero)

            prefill_tokens = sum(t for _, t in prefill)
            kv = sum(s.kv for s in running) + prefill_tokens
            dt = self.perf.step_time(prefill_tokens, len(decoding), kv)
            self.clock.advance(max(dt, 0.0))
            t = self.clock.now()
            step += 1

            emit: list[_State] = list(decoding)
            for s, take in prefill:
                s.prefilled += take
                if not s.needs_prefill:
                    emit.append(s)
            for s in emit:
                s.generated += 1
                s.token_times.append(t)
                if s.first_token_time is None:
                    s.first_token_time = t
            for s, take in prefill:
                key = s.req.slo.program_id or s.req.rid
                attained[key] = attained.get(key, 0.0) + take
            for s in decoding:
                key = s.req.slo.program_id or s.req.rid
                attained[key] = attained.get(key, 0.0) + 1
            done = [s for s in running if s.generated >= s.req.output_len]
            for s in done:
                finish(s, t, None)
            running = [s for s in running if s.generated < s.req.output_len]

        end = self.clock.now()
        for s in waiting + running:
            finish(s, None, None)
        for r in arrivals.never_arrived():
            records[r.rid] = SimRecord(r, [], None, None, 0)
        return SimResult(records=records, end_time=end, steps=step, plans=plans, trace=trace)

    def _ordered(self, waiting: list[_State], plan: FinalPlan) -> list[_State]:
        """The plan's order first, unlisted requests after in queue order, declined ones last."""
        for s in waiting:
            s.be_tier = s.req.rid in plan.best_effort
        if plan.order is None:
            ranked = list(waiting)
        else:
            pos = {rid: i for i, rid in enumerate(plan.order)}
            ranked = sorted(waiting, key=lambda s: pos.get(s.req.rid, len(pos)))
        if plan.best_effort:
            ranked = [s for s in ranked if not s.be_tier] + [s for s in ranked if s.be_tier]
        return ranked

    def _view(self, s: _State, attained: dict[str, float]) -> RequestView:
        r = s.req
        predicted = r.predicted_output_len
        if self.predictor is not None:
            predicted = self.predictor(r, s.generated)
        return RequestView(
            rid=r.rid,
            slo=r.slo,
            arrival=r.arrival,
            prompt_len=r.prompt_len,
            generated=s.generated,
            max_new_tokens=r.max_new_tokens,
            predicted_output_len=predicted,
            first_token_time=s.first_token_time,
            prefix_cached=0,
            program_arrival=r.program_arrival,
            stage_deadline=r.stage_deadline,
            attained_service=attained.get(r.slo.program_id or r.rid, 0.0),
            best_effort_tier=s.be_tier,
        )
