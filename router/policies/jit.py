"""JITServe multi-replica routing (§4.3): power-of-K copies with replica-specific GMAX priority.

JITServe creates K dummy copies of a request on K randomly sampled replicas; each copy carries
the GMAX priority of the request *on that replica*, Priority(r) = goodput(r) / t_gen(r) (§4.2),
and the replica that schedules a copy first keeps the request. A router cannot run every
replica's scheduler, so we place the request on the replica where its copy's priority is highest,
the one whose scheduler would rank it best. Per sampled replica m, with the same T-model as
GoodServe's Eq. 2:
    t_gen    = d_m · L_out                                  (generation time needed)
    finish   = now + q_m + p_m · L_in + t_gen               (estimated completion)
    goodput  = deadline/compound: weight · (L_in + L_out) if finish ≤ deadline else 0
               latency: weight · output tokens meeting their DSLO due times (token j emitted at
               first + j·d_m, due at arrival + TTFT + j·TPOT)
               best effort: weight · (L_in + L_out)
    priority = goodput / t_gen
Ties (for instance equal speeds) go to the smallest positive slack (deadline − finish: the
just-in-time copy), then fewer requests, then sampling order. If every copy's goodput is zero the
request is late everywhere: it goes to the copy with the least overshoot, best effort. GMAX's
aging term δ is left to the replica's scheduler: at routing time it is the same for every copy.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from router.policies.base import RoutingPolicy, healthy_workers
from router.policies.request_estimates import output_tokens
from router.routing_views import Decision, RouteRequest, WorkerView
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, answer_due, token_due
from scheduler.core.registry import require
from scheduler.core.slo import SloClass


def on_time_tokens(k: float, slope: float, n: int, has_tpot: bool) -> int:
    """Tokens j in [0, n) with k − j·slope ≥ 0, where k is token 0's slack and slope = d − TPOT.
    Without a TPOT only the first token has a target: all count if it is on time."""
    if not has_tpot:
        return n if k >= 0 else 0
    if slope == 0:
        return n if k >= 0 else 0
    bound = k / slope
    if slope > 0:  # falling behind: on time up to floor(bound)
        return 0 if k < 0 else min(n, math.floor(bound) + 1)
    first = max(0, math.ceil(bound))  # catching up: on time from ceil(bound)
    return max(0, n - first)


@dataclass(frozen=True)
class JitParams:
    k: int = 2  # replicas sampled per decision (power of K)
    seed: int = 0
    default_output_tokens: int = DEFAULT_OUTPUT_LEN

    def __post_init__(self) -> None:
        require(self.k >= 1, "k", "must be at least 1", self.k)


class JitPolicy(RoutingPolicy):
    name = "jit"

    def __init__(self, params: JitParams = JitParams()) -> None:
        self.k = params.k
        self.default_output_tokens = params.default_output_tokens
        self._rng = random.Random(params.seed)

    def sample(self, alive: list[WorkerView]) -> list[WorkerView]:
        return alive if self.k >= len(alive) else self._rng.sample(alive, self.k)

    def score(self, req: RouteRequest, w: WorkerView, now: float) -> tuple[float, float]:
        """(priority, slack) of the request's copy on `w`; slack = deadline − finish (inf: no SLO)."""
        l_out = output_tokens(req, self.default_output_tokens)
        t_gen = max(w.decode_s_per_token * l_out, 1e-9)
        first = now + w.queue_delay_s + w.prefill_s_per_token * req.prompt_tokens + w.decode_s_per_token
        finish = first + w.decode_s_per_token * (l_out - 1)
        slo = req.slo
        due = answer_due(slo, req.arrival_s, l_out)
        slack = math.inf if due is None else due - finish
        first_due = token_due(slo, req.arrival_s, 0)
        if slo.slo_class is SloClass.LATENCY and first_due is not None:
            k = first_due - first
            slope = w.decode_s_per_token - (slo.tpot_ms or 0.0) / 1000.0
            tokens = on_time_tokens(k, slope, l_out, slo.tpot_ms is not None)
            if slo.tpot_ms is None:
                slack = k
        elif due is not None and finish > due:
            tokens = 0
        else:
            tokens = req.prompt_tokens + l_out
        return slo.weight * tokens / t_gen, slack

    @staticmethod
    def rank(prio: float, slack: float, load: int) -> tuple[float, float, int]:
        """Sort key, largest wins: priority; among live copies the smallest non-negative slack
        (just in time); among dead copies (priority 0) the least overshoot; then fewer requests."""
        if prio > 0:
            return (prio, -slack if slack >= 0 else -math.inf, -load)
        return (0.0, slack, -load)

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        copies = self.sample(healthy_workers(workers))
        best: tuple[float, float, int] | None = None
        chosen = copies[0]
        for w in copies:
            key = self.rank(*self.score(req, w, now), w.load)
            if best is None or key > best:
                best, chosen = key, w
        assert best is not None
        late = best[0] == 0.0
        detail = {"priority": best[0], "copies": float(len(copies))}
        reason = "late_everywhere" if late else "gmax_priority"
        return Decision(chosen.worker_id, reason=reason, best_effort=late, detail=detail)
