"""Prefill-decode disaggregation at the router: which prefill worker a request's prompt goes to,
and what the decode pool sees of that choice.

The prefill pool is shared by every TPOT tier (PolyServe §4.2 / §4.7). A worker's predicted finish
counts the iteration it is running now (a new prompt waits for it) and every prompt token the
router has already sent there and not seen finish. Two placements (`PREFILL_PLACEMENTS`):
- `spread` (the default): the worker that finishes the prompt soonest. On a fixed prefill pool
  this attains the most TTFTs: the prediction misses the prompts that arrive after it and the
  engine's own pacing, so a worker packed to one request's slack has no room for the tight
  arrivals that follow.
- `pack`: PolyServe's load gradient, the *highest-load* worker that still makes the TTFT
  `ttft_margin` times over (none: the soonest finish, a predicted violation rerouted, never
  dropped). It keeps the other workers idle, for a pool that scales its prefill workers down.

The decode pools are the routing policy's business (per-tier with `polyserve`): the dispatcher
shows it only decode (and co-located) workers. A decode worker's queueing delay is *replaced* by
the chosen prefill worker's predicted finish: its agent's own measured wait runs from the
Submit to the first token, so it already holds the remote prefill, and adding the prediction
counted the prefill twice. The policy checks the rest of the TTFT budget against the decode
worker's own first pass (PolyServe §4.6: the wait before the first decode step counts).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from urllib.parse import urlparse

from router.routing_views import RouteRequest, WorkerView
from scheduler.core.registry import require

PREFILL, DECODE, MIXED = "prefill", "decode", "mixed"
ROOM_BITS = 63  # SGLang's bootstrap rooms are random 63-bit integers
DEFAULT_TTFT_MARGIN = 2.0  # as PolyServePolicy's: one TTFT budget on both sides of a pair
SPREAD, PACK = "spread", "pack"
PREFILL_PLACEMENTS = (SPREAD, PACK)


@dataclass(frozen=True)
class PrefillChoice:
    worker_id: str
    predicted_s: float  # from now until its prefill should be done
    meets_ttft: bool


class PrefillChooser:
    """Places prompts on the prefill pool (`placement`, see the module's docstring); tracks the
    prompt tokens it sent where.

    `ttft_margin`: a prediction meets the TTFT only if it fits the slack this many times over; under
    `pack` a worker takes a request only then. The decode side reads the same prediction and
    leaves the rest of the budget to the decode instance's first pass (`decode_side_views`).
    """

    def __init__(self, placement: str = SPREAD, ttft_margin: float = DEFAULT_TTFT_MARGIN) -> None:
        require(placement in PREFILL_PLACEMENTS, "prefill_placement", f"must be one of {PREFILL_PLACEMENTS}", placement)
        require(ttft_margin >= 1.0, "ttft_margin", "must be >= 1", ttft_margin)
        self.placement = placement
        self.ttft_margin = ttft_margin
        self._outstanding: dict[str, dict[str, int]] = {}  # prefill worker -> {rid: prompt tokens}
        self._where: dict[str, str] = {}  # rid -> prefill worker

    def outstanding_tokens(self, worker_id: str) -> int:
        return sum(self._outstanding.get(worker_id, {}).values())

    def predicted_s(self, w: WorkerView, prompt_tokens: int) -> float:
        """The current iteration, then every queued prompt token and this one at p_g."""
        queued = self.outstanding_tokens(w.worker_id)
        return w.iteration_s + w.prefill_s_per_token * (queued + prompt_tokens)

    def choose(self, req: RouteRequest, prefill_views: Sequence[WorkerView], now: float) -> PrefillChoice | None:
        alive = [w for w in prefill_views if w.healthy]
        if not alive:
            return None
        finish = {w.worker_id: self.predicted_s(w, req.prompt_tokens) for w in alive}
        fastest = min(alive, key=lambda w: finish[w.worker_id])
        if req.slo.ttft_ms is None:  # nothing to pack against: the soonest finish keeps queues short
            return PrefillChoice(fastest.worker_id, finish[fastest.worker_id], True)
        slack = req.arrival_s + req.slo.ttft_ms / 1000.0 - now
        feasible = [w for w in alive if self.ttft_margin * finish[w.worker_id] <= slack]
        if self.placement == SPREAD or not feasible:  # a predicted violation goes where it is least late
            return PrefillChoice(fastest.worker_id, finish[fastest.worker_id], bool(feasible))
        busiest = max(feasible, key=lambda w: self.outstanding_tokens(w.worker_id) + w.queue_len)
        return PrefillChoice(busiest.worker_id, finish[busiest.worker_id], True)

    def on_routed(self, rid: str, worker_id: str, prompt_tokens: int) -> None:
        self.on_done(rid)
        self._outstanding.setdefault(worker_id, {})[rid] = prompt_tokens
        self._where[rid] = worker_id

    def on_done(self, rid: str) -> None:
        worker_id = self._where.pop(rid, None)
        if worker_id is not None:
            self._outstanding.get(worker_id, {}).pop(rid, None)


def is_pd_pool(views: Sequence[WorkerView]) -> bool:
    return any(v.role == PREFILL for v in views)


def decode_side_views(views: Sequence[WorkerView], prefill: PrefillChoice | None) -> list[WorkerView]:
    """What the routing policy may place the request on: decode and co-located workers.

    Decode workers need a prefill partner: without one they are shown unhealthy. With one, their
    queueing delay is the partner's predicted prefill (not added to the agent's measured wait,
    which already contains the remote prefills of the requests it is waiting for) and they
    prefill nothing themselves.
    """
    out = []
    for v in views:
        if v.role == PREFILL:
            continue
        if v.role == DECODE:
            if prefill is None:
                v = replace(v, healthy=False)
            else:
                v = replace(v, queue_delay_s=prefill.predicted_s, prefill_s_per_token=0.0)
        out.append(v)
    return out


def bootstrap_for(http_url: str | None, port: int, rng: random.Random | None = None) -> dict[str, object]:
    """The bootstrap fields of one pairing: a fresh room per placement (a retry never reuses one)."""
    host = (urlparse(http_url).hostname if http_url else None) or "127.0.0.1"
    room = (rng or random).getrandbits(ROOM_BITS)
    return {"host": host, "port": port, "room": room}
