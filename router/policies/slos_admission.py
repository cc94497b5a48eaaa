"""SLOs-Serve per-replica admission (§4.2): the core's multi-SLO DP on a replica's virtual state.

The paper's controller keeps one virtual scheduler per replica and asks it whether a new request's
SLOs are still attainable there. The router's virtual replica is what it knows itself: the requests
it has in flight on the worker (`running_on`) and the worker's measured EMAs. In-flight requests
with a first token are decoders in their TPOT tier; those without one are forced prefill items due
by their prefill deadline; the new request is the one optional item, admitted iff the DP (App. C
form, `scheduler.core.slos_serve.soft_admission.admit`) keeps it while every forced item still holds. SLO terms
come from the core's own `demand`, so deadline and compound requests get the same derived prefill
deadline and TPOT tier as on the single server, and requests the core would not guarantee (no SLO,
or a first-token deadline already missed) decode in the no-target slot: they take batch slots but
no prefill budget, as the core's best-effort tier does. One deviation: a new deadline request whose
derived TPOT is below the replica's fastest step is refused, where the single-server core admits it
without a decode target: here a faster replica may still make it. Derived TPOTs between that step
and `derived_tpot_floor_steps` of them set no tier, as on the engine.

Perf model: the linear step model `base + per_token·tokens` fitted to two figures. per_token
is the worker's prefill seconds per prompt token (a prefill's base cost is amortised over many
tokens); base makes a pure decode step at the reported batch (`running`, at least 1) take the
engine's own predicted decode step (`decode_step_s`). A worker that does not report one is
judged by its measured seconds per output token, which also carry the prefill mixed into each
step, so err toward refusing (`iteration_s` stands in while no decode was measured). Terms a
worker has not reported yet (zero) come from `default_perf`, the core's own default model: a
fresh replica is still judged by deadlines, TPOTs, batch slots and memory, only on nominal speed.

Banked slack: decoders ahead of their schedule let the next batch carry more prefill than the
tightest tier's batch allows, as on the engine (`credit` in `soft_admission.admit`, sized by
`batch_limits.banked_slack_chunk`): each on-time decoder's next token is due at its own DSLO
(`token_due` of the tokens streamed back so far, which lags the worker, so errs early), a
deadline decoder's at its derived TPOT. Without it the router's DP is stricter than the engine
it routes to and refuses what the replica would take.

Memory: the KV capacity minus what is held, the larger of the worker's report and the router's
count of in-flight tokens (the report lags new placements); forced and new items reserve prompt
plus expected output, as admitted-but-waiting requests do in the core.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from router.routing_views import RouteRequest, RunningView, WorkerView
from scheduler.core.batch_limits import STEP_MARGIN
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, token_due
from scheduler.core.perf_model import DEFAULT_COEFFICIENTS, LinearCoefficients, PerfModel
from scheduler.core.registry import require
from scheduler.core.slo import SloClass
from scheduler.core.slos_serve.dp import DpItem, TierBudget
from scheduler.core.slos_serve.items import MIN_DERIVED_TPOT_S, Demand, demand
from scheduler.core.slos_serve.soft_admission import admit
from scheduler.core.types import RequestView


def _next_token_due(run: RunningView, tpot_s: float, now: float) -> float:
    """When a decoder's next token is due: a latency request's DSLO for the tokens streamed
    back so far, a deadline request's one derived TPOT from now; inf when it is already late
    (its attainment is lost, so it constrains nothing)."""
    slo = run.request.slo
    due = None
    if slo.slo_class is SloClass.LATENCY:
        due = token_due(slo, run.request.arrival_s, run.generated)
    if due is None:
        due = now + tpot_s
    return due if due >= now else math.inf


def request_view(req: RouteRequest, generated: int = 0, first_token_s: float | None = None) -> RequestView:
    """The core's view of a routed request (router clock; no prefix cache known per worker)."""
    return RequestView(
        rid=req.rid,
        slo=req.slo,
        arrival=req.arrival_s,
        prompt_len=req.prompt_tokens,
        generated=generated,
        max_new_tokens=req.max_new_tokens,
        predicted_output_len=req.predicted_output_tokens,
        first_token_time=first_token_s,
    )


@dataclass(frozen=True)
class AdmissionParams:
    default_perf: LinearCoefficients = DEFAULT_COEFFICIENTS  # speeds a worker has not reported yet
    default_output_tokens: int = DEFAULT_OUTPUT_LEN
    deadline_prefill_share: float = 0.2
    idle_batch_s: float = 0.05
    # The workers' prefill chunk (SGLang's default on 80 GB GPUs). The core needs a cap: without one,
    # batches with no TPOT to keep last idle_batch_s, which a slow replica's base step alone overruns.
    chunk_size: int = 8192
    # A deadline's derived TPOT under this many lone steps sets no tier in the replica's DP (it
    # decodes without a target), as SlosServeParams.derived_tpot_floor_steps does on the engine: one
    # request running behind must not make a replica look full for every newcomer. The same
    # floor as on the engine, so a replica's DP and its engine protect the same requests.
    derived_tpot_floor_steps: float = 4.0
    # Count the decoders' banked slack as extra prefill for the next batch, as the engine's
    # admission does (SlosServeParams.banked_slack): the replica's DP and its engine then
    # agree on what fits.
    banked_slack: bool = True

    def __post_init__(self) -> None:
        require(
            self.derived_tpot_floor_steps >= 1.0,
            "derived_tpot_floor_steps",
            "must be >= 1 (under one lone step no replica can hold the TPOT)",
            self.derived_tpot_floor_steps,
        )


class ReplicaAdmission:
    """`admit(req, worker)` for SlosRoutingPolicy: can this replica still meet req's SLOs?"""

    def __init__(
        self,
        running_on: Callable[[str], Sequence[RunningView]],
        params: AdmissionParams = AdmissionParams(),
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.running_on = running_on
        self.clock = clock  # the router clock: the one arrival_s and first_token_s are stamped with
        self.default_perf = params.default_perf
        self.default_output = params.default_output_tokens
        self.prefill_share = params.deadline_prefill_share
        self.idle = params.idle_batch_s
        self.chunk = params.chunk_size
        self.floor_steps = params.derived_tpot_floor_steps
        self.banked_slack = params.banked_slack

    def coefficients(self, w: WorkerView) -> LinearCoefficients:
        """A linear step time from the worker's EMAs, unreported terms from `default_perf`."""
        per_token = w.prefill_s_per_token or self.default_perf.per_token_s
        step = w.decode_step_s or w.decode_s_per_token or w.iteration_s
        if step <= 0:
            return replace(self.default_perf, per_token_s=per_token)
        return LinearCoefficients(base_s=max(0.0, step - per_token * max(1, w.running)), per_token_s=per_token)

    def perf_model(self, w: WorkerView) -> PerfModel:
        return self.coefficients(w).model()

    def _banked_credit(
        self, budget: TierBudget, counts: tuple[int, ...], room_s: float, decodes: int, kv: int
    ) -> float:
        """Prefill tokens the next batch may carry beyond its shape's budget: the largest chunk
        whose step keeps every on-time decoder's next token (with the levers' step margin),
        less what the shape already gives. 0 when nothing is ahead of its schedule."""
        if not self.banked_slack or not math.isfinite(room_s) or room_s <= 0:
            return 0.0
        shape = budget(counts)
        if not shape.stable:
            return 0.0
        fit = budget.perf.max_chunk_within(room_s / (1 + STEP_MARGIN), decodes, kv, self.chunk)
        return max(0.0, fit - shape.prefill_budget)

    def _demand(self, view: RequestView, now: float, floor: float) -> Demand | None:
        return demand(view, now, self.default_output, self.prefill_share, floor)

    def __call__(self, req: RouteRequest, w: WorkerView) -> bool:
        now = max(self.clock(), req.arrival_s)
        perf = self.perf_model(w)
        lone = perf.step_time(0, 1, 0)  # the fastest decode step there is here
        # A deadline needing decodes faster than that is lost on this replica; one needing them
        # faster than `tier_floor` is kept without a decode target (the core's rule).
        floor = max(MIN_DERIVED_TPOT_S, lone)
        tier_floor = max(floor, self.floor_steps * lone)
        new = self._demand(request_view(req), now, floor)
        if new is None:
            return True  # nothing to guarantee
        if new.deadline <= now:
            return False  # its first token is already late everywhere
        if new.tpot is not None and new.tpot < lone:
            return False  # its TPOT cannot hold even alone (the DP's answer, without building it)
        if new.tpot is None and req.slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND):
            # Its derived TPOT is below the floor: the core would still take it without a decode
            # target (single server, nowhere else to go); a faster replica may make it.
            return False
        if (
            req.slo.slo_class in (SloClass.DEADLINE, SloClass.COMPOUND)
            and new.tpot is not None
            and new.tpot < tier_floor
        ):
            new = replace(new, tpot=None)  # possible here, but not worth every batch's time
        runs = [run for run in self.running_on(w.worker_id) if run.request.rid != req.rid]  # not itself, re-placed
        held = sum(run.request.prompt_tokens + run.generated for run in runs if run.first_token_s is not None)
        mem_budget = w.kv_capacity_tokens - max(w.kv_used_tokens, held)
        if len(runs) >= w.max_running or new.mem_tokens > mem_budget:
            return False  # no batch slot or memory: the DP would refuse too, and this is a busy replica's usual case
        decoders: list[float | None] = []  # TPOT per decoder, None: no target
        prefills: list[tuple[RouteRequest, Demand]] = [(req, new)]  # the new item, then the forced ones
        next_due = math.inf  # the earliest next token an on-time decoder with a target has due
        for run in runs:
            d = self._demand(request_view(run.request, run.generated, run.first_token_s), now, tier_floor)
            if run.first_token_s is None and d is not None and d.deadline > now:
                prefills.append((run.request, d))
                continue
            decoders.append(None if d is None else d.tpot)
            if d is not None and d.tpot is not None:
                next_due = min(next_due, _next_token_due(run, d.tpot, now))
        tiers = sorted({t for t in decoders if t is not None} | {d.tpot for _, d in prefills if d.tpot is not None})
        slot: dict[float | None, int] = {None: -1, **{t: i for i, t in enumerate(tiers)}}
        counts = [0] * (len(tiers) + 1)
        for t in decoders:
            counts[slot[t]] += 1
        items = [
            DpItem(r.rid, d.deadline, d.prefill_tokens, d.mem_tokens, slot[d.tpot], r.slo.weight, forced=r is not req)
            for r, d in prefills
        ]
        budget = TierBudget(perf, tiers, held, self.chunk, self.idle)
        credit = self._banked_credit(budget, tuple(counts), next_due - now, len(decoders), held)
        # fallback_items=0: when the forced requests cannot all be kept, the answer is no; the
        # re-decision of which to keep is not needed for it.
        result = admit(items, budget, tuple(counts), now, mem_budget, w.max_running, fallback_items=0, credit=credit)
        # A replica that cannot keep its own forced requests takes no more (they are not dropped).
        return result.forced_ok and req.rid in result.admitted
