"""A single-engine, virtual-time simulator that runs any Policy the way the adapter would.

Why: policies must be compared and tested on exact, repeatable schedules without a GPU. Each
iteration the engine (scheduler/core/sim_engine.py) asks the policy for a StepPlan while
requests wait, as the adapter does, and finishes it on the same plan path
(scheduler/core/plan_path.py: queue-timeout drops, sized SLO levers, guards), applies it
(drop, preempt, order, best_effort, batch_cap, chunk_size, prefill gate) with SGLang-like
continuous batching and chunked prefill, charges the iteration `perf.step_time(...)` seconds on a
ManualClock, and emits one token per decoding request (the iteration that finishes a prefill
emits the first). Passes with nothing waiting are not planned: the last plan's chunk stays.
Preempted requests keep their tokens and recompute their KV when resumed, like SGLang's retract.
The true output length is known only to the simulator; views expose what a server would.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.clock import ManualClock
from scheduler.core.compound import EXPIRE_EVERY_STEPS, CompoundDeadlines
from scheduler.core.estimates import absolute_deadline, deadline_seconds
from scheduler.core.outcome import SloOutcome, evaluate
from scheduler.core.plan_path import FinalPlan, PlanSettings, settings_for
from scheduler.core.sim_engine import SimEngine
from scheduler.core.sim_requests import KV_TOO_LARGE, EngineConfig, Finished, SimRequest
from scheduler.core.types import EngineView, PerfModel, Policy

__all__ = ["Arrivals", "EngineConfig", "SimRecord", "SimRequest", "SimResult", "Simulator"]


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


class Arrivals:
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
    """Run `policy` over `requests` on one engine; `predictor` may refine predicted lengths, and
    `lengths` bounds them as the server does (`--slo-length-predictor`: asked per request, refined
    every N tokens, and, for an online predictor, taught by every answered request).
    `record_trace` keeps every planned step's view and finished plan (for comparing plan paths);
    `plan_perf` is the model the engine's levers are sized with (the server's perf model,
    which may differ from the steps' real times, `perf`). `compound`, when given, gives each
    compound stage the sub-deadline the server's view builder would (learned from finished
    programs, JITServe §4.1); the records keep the requests as sent, so outcomes are still
    scored against the program's deadline."""

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
        lengths: LiveLengthBounds | None = None,
        compound: CompoundDeadlines | None = None,
    ) -> None:
        self.lengths = lengths
        self.compound = compound
        self.policy = policy
        self.perf = perf
        self.plan_perf = plan_perf if plan_perf is not None else perf  # what the levers are sized with
        self.cfg = config or EngineConfig()
        self.clock = clock or ManualClock()
        self.predictor = predictor
        self.settings = settings if settings is not None else settings_for(policy)
        self.record_trace = record_trace

    def run(self, requests: Iterable[SimRequest], max_steps: int = 1_000_000, until: float | None = None) -> SimResult:
        arrivals = Arrivals(requests)
        records: dict[str, SimRecord] = {}
        engine = SimEngine(
            self.policy,
            self.perf,
            self.cfg,
            self.settings,
            plan_perf=self.plan_perf,
            predictor=self.predictor,
            record_trace=self.record_trace,
            lengths=self.lengths,
        )

        sent: dict[str, SimRequest] = {}  # as the client sent them, where the engine got a stage deadline

        def finish(f: Finished) -> None:
            t = None if f.reason is not None else f.time
            req = sent.pop(f.req.rid, f.req)
            records[req.rid] = SimRecord(req, f.token_times, t, f.reason, f.preemptions)
            arrivals.finished(req.rid, t)
            if self.compound is not None and t is not None and req.slo.program_id is not None:
                self.compound.on_finish(req.slo.program_id, req.slo.stage, req.prompt_len, len(f.token_times), t)

        while engine.steps < max_steps:
            now = self.clock.now()
            if until is not None and now >= until:
                break
            for req in arrivals.due(now):
                if self.compound is not None:
                    req = self._with_stage_deadline(req, now, sent)
                if engine.add(req) == KV_TOO_LARGE:  # could never fit, as SGLang rejects it
                    finish(Finished(req, [], now, KV_TOO_LARGE, 0))
            if not engine.has_work:
                nxt = arrivals.next_time()
                if nxt is None:
                    break
                self.clock.set(max(now, nxt))
                continue
            end = engine.begin_step(now)
            for f in engine.take_dropped():
                finish(f)
            if end is None:
                nxt = arrivals.next_time()
                if nxt is not None:
                    self.clock.set(max(now, nxt))
                    continue
                break  # nothing can ever run (e.g. the policy capped the batch at zero)
            self.clock.set(end)
            for f in engine.end_step().finished:
                finish(f)
            if self.compound is not None and engine.steps % EXPIRE_EVERY_STEPS == 0:
                self.compound.expire(end)

        end_time = self.clock.now()
        leftover = [*engine.waiting, *engine.running.values()]
        for st in leftover:  # still queued or running when the run stopped
            req = sent.get(st.req.rid, st.req)
            records[req.rid] = SimRecord(req, engine.tokens_of(st), None, None, st.preemptions)
            arrivals.finished(st.req.rid, None)
        for r in arrivals.never_arrived():
            records[r.rid] = SimRecord(r, [], None, None, 0)
        return SimResult(records=records, end_time=end_time, steps=engine.steps, plans=engine.plans, trace=engine.trace)

    def _with_stage_deadline(self, req: SimRequest, now: float, sent: dict[str, SimRequest]) -> SimRequest:
        """The request as the engine sees it: a compound stage with its sub-deadline, fixed when
        the stage first arrives (as the server's view builder fixes it)."""
        slo = req.slo
        if self.compound is None or slo.program_id is None or slo.deadline_ms is None:
            return req
        program_arrival = req.program_arrival if req.program_arrival is not None else req.arrival
        due = self.compound.stage_deadline(slo.program_id, slo.stage, program_arrival, slo.deadline_ms / 1000.0, now)
        if due is None:
            return req
        sent[req.rid] = req
        return replace(req, stage_deadline=due)
