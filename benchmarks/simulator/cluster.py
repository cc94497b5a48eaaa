"""The discrete-event loop of a simulated cluster: arrivals, router decisions, engine steps,
load reports, migration ticks and PD KV transfers, in virtual time.

Events at the same instant run in this order: arrivals (a request is routed the moment it
arrives, as the router does), KV transfers landing, engine step boundaries (a step that ends
now emits its tokens, then the engine plans its next step seeing everything that has arrived),
engines woken by new work, load reports, migration ticks. A request sent to an idle engine
wakes it at the same instant, after every arrival of that instant, as the single-engine
simulator adds all arrivals due before it plans.

PD: the router picks the pair; the prefill engine prefills and makes the first token; the KV
then takes `kv_latency_s + context x KV bytes per token / kv_link_gb_s` to reach the decode
engine, which admits it with its KV (no prefill) and streams the first token to the client at
once. The prefill engine frees the KV when it hands off (transfers overlap its next steps).

Deterministic for a given workload, pool and seed: no wall-clock time enters a decision.
"""

from __future__ import annotations

import gc
import heapq
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.goodput.records import PlannedRequest, RequestRecord
from benchmarks.goodput.scoring import RunMetrics, Scored, score_all, score_record
from benchmarks.simulator.card import Card
from benchmarks.simulator.client import CLIENT_MAX_TOKENS, sim_requests, unsent_record
from benchmarks.simulator.pool import KV_BYTES_PER_TOKEN, PoolSpec, card
from benchmarks.simulator.prefixes import prefix_hashes
from benchmarks.simulator.routing import Flight, SimRouter
from benchmarks.simulator.speculative_decoding import APART, SimSpeculation
from benchmarks.simulator.worker import DECODE, PREFILL, EngineOptions, SimWorker
from benchmarks.workloads.traces import MOONCAKE_BLOCK_TOKENS
from router.pd import SPREAD
from router.policies import RoutingContext, RoutingPolicy
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR
from scheduler.core.pacing import SlowedPerfModel
from scheduler.core.sim import Arrivals
from scheduler.core.sim_engine import KV_TOO_LARGE, PREFILLED, SimRequest, StepOutcome
from server.agent_load import REPORT_S

# event kinds, in their order at equal times
_SEND, _TRANSFER, _STEP, _KICK, _REPORT, _TICK = 0, 1, 2, 3, 4, 5
NO_WORKER = "no_worker"


@dataclass(frozen=True)
class ClusterConfig:
    pool: PoolSpec
    engine: EngineOptions = EngineOptions()
    routing: str = "round_robin"
    routing_params: tuple[tuple[str, Any], ...] = ()
    length_predictor: str | None = DEFAULT_LENGTH_PREDICTOR  # the router's default
    report_s: float = REPORT_S  # the worker agent's default
    migrate_interval_s: float | None = 0.1  # the dispatcher's default; None: never
    prefill_placement: str = SPREAD  # PD: the router's --pd-prefill-placement
    kv_link_gb_s: float = 50.0  # PD: KV transfer bandwidth per pair (GB/s)
    kv_latency_s: float = 0.001
    speculation: str | None = None  # "fixed:S" | "slo" | "slo:S"
    spec_alpha: float = 0.7  # the draft's true acceptance rate (engines only see verify results)
    draft_ratio: float = 0.1  # a draft step's cost over the target's decode step
    spec_layout: str = APART  # where prefill goes under speculation (speculative_decoding.LAYOUTS)
    prefix_cache: bool = True  # engines reuse computed prompt blocks (SGLang's radix cache)
    trace_block_tokens: int = MOONCAKE_BLOCK_TOKENS  # the trace's prefix block (WorkloadSpec.block_tokens)
    client_max_tokens: int = CLIENT_MAX_TOKENS  # the max_new_tokens clients send (the load generator's)
    time_scale: float = 1.0  # every step this many times the card's (an emulated pool in dilated time)
    # Wall time from a client's send to its request being in the engine's queue (HTTP to the
    # router and on, tokenizer, ZMQ): real host time, not scaled by time_scale. 0 on the papers'
    # idealised setups; benchmarks.experiments.simulator_validation measures it on the emulated server.
    host_latency_s: float = 0.0
    seed: int = 0
    horizon_s: float | None = None  # stop this long after the last open-loop arrival
    stream_scores: bool = False  # score each request as it ends and drop its token times (long runs)


@dataclass
class ClusterResult:
    records: list[RequestRecord]  # every planned request as the client saw it (empty when streamed)
    scored: list[Scored]  # every request scored (records kept only as far as the totals need)
    end_s: float
    wall_s: float
    events: int
    decision_ns: list[int]
    counters: dict[str, int]
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)

    def metrics(self, duration_s: float | None = None, alpha: float = 1.0) -> RunMetrics:
        return score_all(self.scored, duration_s, alpha)

    def decision_us(self) -> dict[str, float | None]:
        if not self.decision_ns:
            return {"mean": None, "p50": None, "p99": None}
        ns = sorted(self.decision_ns)
        return {
            "mean": sum(ns) / len(ns) / 1000.0,
            "p50": ns[len(ns) // 2] / 1000.0,
            "p99": ns[min(len(ns) - 1, int(0.99 * len(ns)))] / 1000.0,
        }


def _card(gpu: str, model: str, time_scale: float) -> Card:
    """The profile's card, every step `time_scale` times longer (as `--emulate-slowdown` paces it)."""
    base = card(gpu, model)
    if time_scale == 1.0:
        return base
    slow_pace, slow_plan = SlowedPerfModel(base.pace, time_scale), SlowedPerfModel(base.plan_with, time_scale)
    return replace(base, pace=slow_pace, plan_with=slow_plan)


@dataclass
class _Track:
    """The client's side of one request: when it was sent and what came back."""

    send_s: float | None = None
    token_s: list[float] | None = None
    finish_s: float | None = None
    error: str | None = None


class ClusterSim:
    """`routing_policy`: build the router's policy from its context yourself (tests, a policy not
    in the registry) instead of by `config.routing`."""

    def __init__(
        self, config: ClusterConfig, routing_policy: Callable[[RoutingContext], RoutingPolicy] | None = None
    ) -> None:
        self.config = config
        self.now = 0.0
        clock = self._clock
        workers = []
        for k, (wid, gpu, role) in enumerate(config.pool.workers()):
            spec = None
            if config.speculation and role != PREFILL:
                spec = SimSpeculation(
                    config.speculation, config.spec_alpha, config.draft_ratio, config.seed + k, config.spec_layout
                )
            workers.append(
                SimWorker(
                    wid,
                    _card(gpu, config.pool.model, config.time_scale),
                    role,
                    config.engine,
                    clock,
                    spec,
                    config.spec_layout,
                    prefix_block_tokens=64 if config.prefix_cache else 0,
                )
            )
        self.workers = workers
        self.by_id = {w.worker_id: w for w in workers}
        self.router = SimRouter(
            config.routing,
            dict(config.routing_params),
            workers,
            clock,
            config.length_predictor,
            delivered=self._delivered,
            make_policy=routing_policy,
            prefill_placement=config.prefill_placement,
        )
        self.kv_bytes = KV_BYTES_PER_TOKEN.get(config.pool.model, KV_BYTES_PER_TOKEN["llama3-8b"])
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._tracks: dict[str, _Track] = {}
        self._engine_req: dict[str, SimRequest] = {}  # rid -> the request as the workload sent it
        self._planned: dict[str, PlannedRequest] = {}
        self._program_start: dict[str, float] = {}  # program -> its first send
        self._scored: dict[str, Scored] = {}  # streamed: requests scored as they ended
        self._arrivals: Arrivals | None = None
        self._pending_work = 0  # engine steps, wake-ups and KV transfers in the heap
        self.events = 0

    def _clock(self) -> float:
        return self.now

    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        if kind <= _KICK:
            self._pending_work += 1
        heapq.heappush(self._heap, (t, kind, self._seq, payload))

    # ---- run ---------------------------------------------------------------------------------
    def run(self, planned: Sequence[PlannedRequest]) -> ClusterResult:
        started = time.perf_counter()
        gc.collect()
        gc.freeze()  # the workload's objects live for the whole run: the collector need not rescan them
        reqs = sim_requests(planned, self.config.client_max_tokens)
        block = self.config.trace_block_tokens
        for r, p in zip(reqs, planned, strict=True):
            hashes = prefix_hashes(p.req, block)
            if hashes:
                r.prefix_hashes = hashes
        self._engine_req = {r.rid: r for r in reqs}
        self._planned = {p.req.rid: p for p in planned}
        arrivals = self._arrivals = Arrivals(reqs)
        last_open = max((r.arrival for r in reqs if not r.parents), default=0.0)
        until = None if self.config.horizon_s is None else last_open + self.config.horizon_s
        n = len(self.workers)
        for i, w in enumerate(self.workers):  # agents start apart, as real workers do
            self._push(self.config.report_s * (i + 1) / n, _REPORT, w)
        if self.config.migrate_interval_s is not None:
            self._push(self.config.migrate_interval_s, _TICK, None)
        heap = self._heap
        while True:
            t_arr = arrivals.next_time()
            if t_arr is not None and (not heap or t_arr <= heap[0][0]):
                if until is not None and t_arr > until:
                    break
                self.now = max(self.now, t_arr)
                for req in arrivals.due(self.now):
                    self._arrive(req)
                continue
            if not heap:
                break
            t, kind, _, payload = heapq.heappop(heap)
            if until is not None and t > until:
                break
            self.now = t
            self.events += 1
            if kind <= _KICK:
                self._pending_work -= 1
            if kind == _STEP:
                self._step_end(payload)
            elif kind == _KICK:
                payload.kick_pending = False
                if payload.step_end is None:
                    self._begin(payload)
            elif kind == _TRANSFER:
                self._transfer_done(*payload)
            elif kind == _SEND:
                worker, req, flight, hop = payload
                if not flight.done and flight.hop == hop:  # not failed or moved on the way
                    self._deliver(worker, req, flight)
            elif kind == _REPORT:
                self.router.on_report(payload.worker_id, payload.report())
                if self._active():
                    self._push(t + self.config.report_s, _REPORT, payload)
            elif kind == _TICK:
                for rid, target in self.router.migrations():
                    self._migrate(rid, target)
                if self._active():
                    self._push(t + (self.config.migrate_interval_s or 0.0), _TICK, None)
        gc.unfreeze()
        records = [self._record(p) for p in planned if p.req.rid not in self._scored]
        scored = [self._scored.get(p.req.rid) for p in planned]
        rest = iter(records)
        scored_all = [s if s is not None else score_record(next(rest)) for s in scored]
        return ClusterResult(
            records=[] if self.config.stream_scores else records,
            scored=scored_all,
            end_s=self.now,
            wall_s=time.perf_counter() - started,
            events=self.events,
            decision_ns=self.router.decision_ns,
            counters=dict(self.router.counters),
            workers={w.worker_id: self._worker_stats(w) for w in self.workers},
        )

    def _active(self) -> bool:
        """Anything left to happen: requests to arrive, or requests in flight that some engine
        step or transfer will move (requests no engine can ever run end the simulation)."""
        assert self._arrivals is not None
        if self._arrivals.next_time() is not None:
            return True
        return bool(self.router.flights) and self._pending_work > 0

    # ---- requests ----------------------------------------------------------------------------
    def _arrive(self, req: SimRequest) -> None:
        self._tracks[req.rid] = _Track(send_s=self.now)
        pid = self._planned[req.rid].req.program_id
        if pid is not None and pid not in self._program_start:
            self._program_start[pid] = self.now
        route = self.router.route_request(
            req.rid, req.prompt_len, req.slo, self.now, req.max_new_tokens, req.prefix_hashes
        )
        flight = Flight(route)
        self.router.flights[req.rid] = flight
        self._place(flight, req)

    def _place(self, flight: Flight, req: SimRequest) -> None:
        choice = self.router.choose(flight)
        if choice is None:
            self._fail(flight, NO_WORKER)
            return
        decision, prefill = choice
        owner = decision.worker_id
        self.router.assign(flight, owner, prefill, req.prompt_len)
        self.by_id[owner].sent(req.rid, req.prompt_len)
        if prefill is not None:
            self.by_id[prefill].sent(req.rid, req.prompt_len)
        first = self.by_id[prefill if prefill is not None else owner]
        if self.config.host_latency_s > 0:
            self._push(self.now + self.config.host_latency_s, _SEND, (first, req, flight, flight.hop))
        else:
            self._deliver(first, req, flight)

    def _deliver(self, worker: SimWorker, req: SimRequest, flight: Flight) -> None:
        if worker.engine.add(req) == KV_TOO_LARGE:  # SGLang rejects a request that can never fit
            self._fail(flight, KV_TOO_LARGE)
            return
        if worker.step_end is None and not worker.kick_pending:
            worker.kick_pending = True
            self._push(self.now, _KICK, worker)

    def _fail(self, flight: Flight, reason: str) -> None:
        rid = flight.route.rid
        track = self._tracks[rid]
        track.error, track.finish_s = reason, self.now
        track.token_s = list(flight.prior_tokens)
        for wid in (flight.owner, flight.prefill):
            if wid is not None:
                self.by_id[wid].engine.remove(rid)
                self.by_id[wid].forgot(rid)
        self.router.release(flight)
        flight.done = True
        self.router.flights.pop(rid, None)
        self._ended(rid)
        assert self._arrivals is not None
        self._arrivals.finished(rid, None)

    def _delivered(self, flight: Flight) -> int:
        """Tokens the client has of this flight: earlier hops' and its owner engine's so far."""
        n = len(flight.prior_tokens)
        if flight.owner is not None:
            n += self.by_id[flight.owner].engine.emitted(flight.route.rid) or 0
        return n

    # ---- engines -----------------------------------------------------------------------------
    def _begin(self, worker: SimWorker) -> None:
        engine = worker.engine
        end = engine.begin_step(self.now)
        for f in engine.take_dropped():
            flight = self.router.flights.get(f.req.rid)
            if flight is not None:
                self._fail(flight, f.reason or "dropped")
        worker.step_end = end
        if end is not None:
            self._push(end, _STEP, worker)

    def _step_end(self, worker: SimWorker) -> None:
        outcome: StepOutcome = worker.engine.end_step()
        worker.step_end = None
        worker.observe(outcome)
        for f in outcome.finished:
            flight = self.router.flights.get(f.req.rid)
            if flight is None:
                continue
            if f.reason == PREFILLED:
                self._handed_off(worker, flight, f.req, f.time)
            elif f.reason is None:
                self._completed(flight, f.token_times, f.time)
        if outcome.first_tokens and worker.role != PREFILL:
            for req, t in outcome.first_tokens:
                flight = self.router.flights.get(req.rid)
                if flight is not None and flight.first_token_s is None:
                    flight.first_token_s = t
        if worker.engine.has_work:
            assert self._arrivals is not None
            follow = self._arrivals.next_time()
            if follow is not None and follow <= self.now:  # a stage its parent just released: route it first
                worker.kick_pending = True
                self._push(self.now, _KICK, worker)
            else:
                self._begin(worker)

    def _completed(self, flight: Flight, tokens: list[float], t: float) -> None:
        rid = flight.route.rid
        track = self._tracks[rid]
        track.token_s = flight.prior_tokens + tokens if flight.prior_tokens else tokens
        track.finish_s = t
        if flight.owner is not None:
            self.by_id[flight.owner].forgot(rid)
        self.router.finished(flight, len(track.token_s))
        self._ended(rid)
        assert self._arrivals is not None
        self._arrivals.finished(rid, t)

    def _ended(self, rid: str) -> None:
        """Streamed scoring: the request is scored now and its token times let go."""
        if self.config.stream_scores:
            self._scored[rid] = score_record(self._record(self._planned[rid]))
            self._scored[rid].record.token_s = []
            del self._tracks[rid]

    def _handed_off(self, prefill: SimWorker, flight: Flight, req: SimRequest, t: float) -> None:
        """A PD prefill is done: the KV travels to the decode worker of this placement."""
        self.router.prefill_done(flight)
        if flight.owner is None:
            return
        context = req.prompt_len + req.generated + 1
        delay = self.config.kv_latency_s + context * self.kv_bytes / (self.config.kv_link_gb_s * 1e9)
        decode_req = replace(req, generated=req.generated + 1)
        self._push(t + delay, _TRANSFER, (flight, flight.hop, decode_req))

    def _transfer_done(self, flight: Flight, hop: int, req: SimRequest) -> None:
        if flight.done or flight.hop != hop or flight.owner is None:
            return  # migrated or failed meanwhile
        self._deliver(self.by_id[flight.owner], req, flight)

    # ---- migration (the dispatcher's _migrate) ------------------------------------------------
    def _migrate(self, rid: str, target: str) -> None:
        router = self.router
        flight = router.flights.get(rid)
        source = None if flight is None else flight.owner
        worker = self.by_id.get(target)
        if flight is None or source is None or source == target or worker is None or worker.role == PREFILL:
            router.counters["migrations_skipped"] += 1
            return
        delivered = self._delivered(flight)
        cap = flight.route.max_new_tokens
        original = self._engine_req[rid]
        if (cap is not None and delivered >= cap) or delivered >= original.output_len:
            router.counters["migrations_skipped"] += 1
            return
        prefill = None
        if worker.role == DECODE:
            choice = router.choose_prefill(flight, delivered)
            if choice is None:
                router.counters["migrations_skipped"] += 1
                return
            prefill = choice
        for wid in (source, flight.prefill):
            if wid is None:
                continue
            taken = self.by_id[wid].engine.remove(rid)
            if wid == source and taken is not None:
                flight.prior_tokens.extend(taken[1])
            self.by_id[wid].forgot(rid)
        router.release(flight)
        resumed = replace(
            original,
            prompt_len=original.prompt_len + delivered,
            output_len=original.output_len - delivered,
            max_new_tokens=None if cap is None else cap - delivered,
            arrival=self._tracks[rid].send_s or original.arrival,
            generated=0,
        )
        router.assign(flight, target, prefill, resumed.prompt_len)
        router.policy.on_routed(flight.route, target)
        router.counters["migrated"] += 1
        flight.migrations += 1
        worker.sent(rid, resumed.prompt_len)
        if prefill is not None:
            self.by_id[prefill].sent(rid, resumed.prompt_len)
            self._deliver(self.by_id[prefill], resumed, flight)
        else:
            self._deliver(worker, resumed, flight)

    # ---- results -----------------------------------------------------------------------------
    def _record(self, p: PlannedRequest) -> RequestRecord:
        """The request as the load generator would have recorded it."""
        r = p.req
        rec = unsent_record(p, self._program_start)
        track = self._tracks.get(r.rid)
        if track is None or track.send_s is None:
            return rec  # never sent: a parent failed, or the run ended first
        rec.send_s = track.send_s
        if track.error is not None:
            rec.token_s = list(track.token_s or [])
            rec.finish_s, rec.finish_reason, rec.error = track.finish_s, "abort", track.error
        elif track.finish_s is not None:
            rec.token_s = track.token_s or []
            rec.finish_s, rec.finish_reason = track.finish_s, "length"
        else:
            flight = self.router.flights.get(r.rid)
            rec.token_s = self._tokens_so_far(flight) if flight is not None else []
            rec.cut = True  # still queued or running when the simulation stopped
        return rec

    def _tokens_so_far(self, flight: Flight) -> list[float]:
        tokens = list(flight.prior_tokens)
        if flight.owner is not None:
            tokens.extend(self.by_id[flight.owner].engine.tokens(flight.route.rid) or [])
        return tokens

    def _worker_stats(self, w: SimWorker) -> dict[str, Any]:
        e = w.engine
        return {"gpu": w.registration.gpu, "role": w.role, "steps": e.steps, "plans_with_preempt_or_drop": len(e.plans)}
