"""GoodServe routing (Alg. 1 in App. A.2, §3.4): just-enough instance selection plus periodic
SLO-risk re-checks that migrate requests about to miss onto a stronger worker.

Selection, per request r and worker g (Eq. 2):
    T(r, g) = q_g + p_g·(L_in − H_{r,g}) + d_g·L_out
q_g, p_g, d_g are the worker's EMA estimates (WorkerView.queue_delay_s, prefill_s_per_token,
decode_s_per_token); Alg. 1 line 5 smooths the reported wait once more with `alpha` (default 1:
the worker already reports an EMA, smoothing twice would only lag). H is the prefix the worker
likely caches (leading matched blocks × `block_tokens`, from the table of what this policy sent
where); L_out is the predicted output length (request_estimates.output_tokens). D_r is the time left to
the SLO deadline (scheduler.core.estimates.answer_due). Among workers with T ≤ D_r the one with the largest d_g
(slowest decode: just enough, keeping fast GPUs for urgent work) wins. The paper gives no
tie-break, and its black-box d_g also grows with a worker's batch, so taken literally the rule
prefers the busier of two identical cards and herds a burst onto one of them. So workers whose
d_g is within `speed_tolerance` (default 15 %) of the slowest feasible one count as the same
class, and among them the smallest T (most slack, i.e. the least loaded) wins, then list order.
With no feasible worker the one minimising
T − D_r wins and the decision is best effort: the paper's "most capable instance" (§6,
Limitation). Under tight SLOs, where most requests are infeasible everywhere, that piles hopeless
work onto the fastest cards and delays the feasible requests they were kept for. `infeasible=
"least_loaded"` spreads them instead (the conventional way), which gains under very tight SLOs
but loses where a best-effort request is often only just late and the fast card saves it; so the
default stays the paper's (benchmarks/RESULTS.md, routing).
Requests without an SLO are routed the conventional way (least loaded), as GoodServe §5
suggests.

Migration (§3.4): every `tau`-th call to `migrations` (the router calls it once per tick, so tau
counts router ticks rather than engine iterations) each running request is re-estimated with the
workers' fresh EMAs: remaining = L_out − generated (request_estimates.remaining_tokens), no queueing on
its current worker. If it will miss its deadline there, it moves to a worker with faster decode
that meets it counting that worker's queue and the re-prefill of prompt + generated tokens
(token-ID migration), again chosen just-enough (same speed classes). Each planned move adds its re-prefill time to the
target's queue for the rest of that check, so one tick does not pile every rescue onto one GPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from router.policies.base import RoutingPolicy, healthy_workers, least_loaded
from router.policies.prefix_table import DEFAULT_MAX_BLOCKS, PrefixTable
from router.policies.request_estimates import counted_tokens, output_tokens, remaining_tokens
from router.routing_views import Decision, RouteRequest, RunningView, WorkerView
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, answer_due
from scheduler.core.registry import require

_C = TypeVar("_C")
DEFAULT_BLOCK_TOKENS = 64  # tokens per prefix hash block (the benchmarks' workload block size)
MOST_CAPABLE, LEAST_LOADED = "most_capable", "least_loaded"
INFEASIBLE_CHOICES = (MOST_CAPABLE, LEAST_LOADED)


@dataclass(frozen=True)
class GoodServeParams:
    tau: int = 50  # migration checks happen every tau decisions
    alpha: float = 1.0  # EMA weight of the newest queue delay
    speed_tolerance: float = 0.15
    block_tokens: int = DEFAULT_BLOCK_TOKENS
    default_output_tokens: int = DEFAULT_OUTPUT_LEN
    max_blocks_per_worker: int = DEFAULT_MAX_BLOCKS
    infeasible: str = MOST_CAPABLE  # where a request no worker can serve in time goes

    def __post_init__(self) -> None:
        require(self.tau > 0, "tau", "must be positive", self.tau)
        require(self.infeasible in INFEASIBLE_CHOICES, "infeasible", f"one of {INFEASIBLE_CHOICES}", self.infeasible)
        require(0.0 < self.alpha <= 1.0, "alpha", "must be in (0, 1]", self.alpha)
        require(self.speed_tolerance >= 0, "speed_tolerance", "must be >= 0", self.speed_tolerance)


class GoodServePolicy(RoutingPolicy):
    name = "goodserve"

    def __init__(self, params: GoodServeParams = GoodServeParams()) -> None:
        self.params = params
        self.block_tokens = params.block_tokens  # the service hashes prompts in blocks of this size
        self.table = PrefixTable(params.max_blocks_per_worker)
        self._q: dict[str, float] = {}  # Alg. 1 line 5: the policy's own smoothed q_g
        self._checks = 0

    def forget_worker(self, worker_id: str) -> None:
        self.table.forget(worker_id)
        self._q.pop(worker_id, None)

    # -- estimates ---------------------------------------------------------------------------

    def queue_delay(self, w: WorkerView) -> float:
        """q_g ← α·w_g + (1 − α)·q_g (Alg. 1 lines 4–5)."""
        alpha = self.params.alpha
        if alpha >= 1.0:
            return w.queue_delay_s
        prev = self._q.get(w.worker_id)
        q = w.queue_delay_s if prev is None else alpha * w.queue_delay_s + (1.0 - alpha) * prev
        self._q[w.worker_id] = q
        return q

    def reuse(self, req: RouteRequest) -> dict[str, int]:
        """H_{r,g} in tokens for the workers that likely hold part of the prompt's prefix."""
        if not req.prefix_hashes:
            return {}
        cap = req.prompt_tokens
        return {wid: min(b * self.block_tokens, cap) for wid, b in self.table.matches(req.prefix_hashes).items()}

    # -- routing (Alg. 1) --------------------------------------------------------------------

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        l_out = output_tokens(req, self.params.default_output_tokens)
        due = answer_due(req.slo, req.arrival_s, l_out)
        if due is None:
            w = least_loaded(alive)
            self.table.record(w.worker_id, req.prefix_hashes)
            return Decision(w.worker_id, reason="no_slo_least_loaded")
        budget = due - now
        decode = counted_tokens(req, l_out)
        hits = self.reuse(req)
        feasible: list[tuple[float, float, WorkerView]] = []  # (d_g, T, worker)
        fallback: tuple[float, WorkerView] | None = None  # (T − D, worker): min wins
        estimate: dict[str, float] = {}
        for w in alive:
            hit = hits.get(w.worker_id, 0)
            t = self.queue_delay(w) + w.prefill_s_per_token * (req.prompt_tokens - hit) + w.decode_s_per_token * decode
            estimate[w.worker_id] = t
            if t <= budget:
                feasible.append((w.decode_s_per_token, t, w))
            elif fallback is None or t - budget < fallback[0]:
                fallback = (t - budget, w)
        if feasible:
            _, t, w = self.just_enough(feasible)
            reason, late = "just_enough", False
        elif self.params.infeasible == LEAST_LOADED:
            w = least_loaded(alive)
            t, reason, late = estimate[w.worker_id], "infeasible_least_loaded", True
        else:
            assert fallback is not None
            over, w = fallback
            t, reason, late = budget + over, "min_overshoot", True
        self.table.record(w.worker_id, req.prefix_hashes)
        detail = {"t_est": t, "budget": budget, "reuse_tokens": float(hits.get(w.worker_id, 0))}
        return Decision(w.worker_id, reason=reason, best_effort=late, detail=detail)

    def just_enough(self, candidates: Sequence[tuple[float, float, _C]]) -> tuple[float, float, _C]:
        """The slowest speed class among feasible (d_g, T, x) candidates, and in it the smallest T."""
        floor = max(d for d, _, _ in candidates) / (1.0 + self.params.speed_tolerance)
        return min((c for c in candidates if c[0] >= floor), key=lambda c: c[1])

    def on_routed(self, req: RouteRequest, worker_id: str) -> None:
        self.table.record(worker_id, req.prefix_hashes)

    # -- risk re-check and migration (§3.4) --------------------------------------------------

    def migrations(
        self, running: Sequence[RunningView], workers: Sequence[WorkerView], now: float
    ) -> list[tuple[str, str]]:
        self._checks += 1
        if self._checks % self.params.tau:
            return []
        ladder = sorted((w for w in workers if w.healthy), key=lambda w: w.decode_s_per_token)
        speeds = [w.decode_s_per_token for w in ladder]
        by_id = {w.worker_id: w for w in workers}
        extra_q: dict[str, float] = {}
        moves: list[tuple[str, str]] = []
        for run in running:
            req = run.request
            l_out = output_tokens(req, self.params.default_output_tokens)
            due = answer_due(req.slo, req.arrival_s, l_out)
            cur = by_id.get(run.worker_id)
            if due is None or cur is None:
                continue
            if counted_tokens(req, l_out) == 1 and run.first_token_s is not None:
                continue  # TTFT-only SLO: already decided
            left = remaining_tokens(req, run.generated, self.params.default_output_tokens)
            stay = cur.decode_s_per_token * left
            if run.first_token_s is None:
                stay += cur.prefill_s_per_token * req.prompt_tokens
            if now + stay <= due:
                continue
            target = self._rescue(req, run.generated, left, cur, ladder, speeds, due - now, extra_q)
            if target is not None:
                wid, prefill = target
                moves.append((req.rid, wid))
                extra_q[wid] = extra_q.get(wid, 0.0) + prefill
        return moves

    def _rescue(
        self,
        req: RouteRequest,
        generated: int,
        left: int,
        cur: WorkerView,
        ladder: Sequence[WorkerView],
        speeds: Sequence[float],
        budget: float,
        extra_q: dict[str, float],
    ) -> tuple[str, float] | None:
        """Just-enough among faster-decoding workers that meet the deadline after re-prefill,
        skipping those whose decode alone overruns the budget. Returns the target and its
        re-prefill time."""
        end = bisect.bisect_left(speeds, cur.decode_s_per_token)  # strictly faster only
        end = min(end, bisect.bisect_right(speeds, budget / left))
        hits = self.reuse(req) if end else {}
        feasible: list[tuple[float, float, tuple[str, float]]] = []  # (d, T, (worker, re-prefill))
        for w in ladder[:end]:
            prefill = w.prefill_s_per_token * (req.prompt_tokens + generated - hits.get(w.worker_id, 0))
            q = self._q.get(w.worker_id, w.queue_delay_s)  # the smoothed q_g when alpha < 1
            t = q + extra_q.get(w.worker_id, 0.0) + prefill + w.decode_s_per_token * left
            if t <= budget:
                feasible.append((w.decode_s_per_token, t, (w.worker_id, prefill)))
        return self.just_enough(feasible)[2] if feasible else None
