"""PolyServe routing (§4.2–4.4, §4.6): TPOT tiers, load-gradient placement, lazy promotion and
per-tier autoscaling signals.

- Binning (§4.2): a request's tier is the loosest configured tier not looser than its TPOT (with
  `tiers_ms=None` every distinct TPOT is its own tier; a TPOT tighter than every tier joins the
  tightest and is checked against its own TPOT). Requests without a TPOT belong to the
  best-effort pool. Instances serve one tier; the policy owns that assignment (seeded from
  WorkerView.tpot_tier_ms the first time it sees a worker) and exposes it as `assignments`.
- Load gradient (§4.3, §4.6): among the tier's instances that can take the request, the one with
  the *highest* load wins, so the last instances of a tier drain and can be given back.
- Can take (`fits`): a free batch slot and enough free KV for prompt + L_out; TTFT: queue delay
  EMA + one full iteration (the wait for the current step, worst case) + prefill of L_in and
  of the prompts queued ahead, `ttft_margin` times over, within the time left; TPOT: the next iteration with this
  request and the queued ones added stays within the instance's tier. Slots and the queue
  are counted as the router best knows them (`_pending`: the reported queue, or its
  placements since the report), not from the last report alone. Iteration time grows with
  batch size as
      t_next = t_iter · (1 + batch_growth · (pending + 1) / max(running, 1))
  i.e. a `batch_growth` share of today's iteration scales linearly with the batch (0.5 by
  default: decode steps are partly weight-bound, partly per-request attention). t_iter is the
  iteration EMA, or decode_s_per_token when no iteration was measured yet.
- Lazy promotion (§4.4): only when no instance of its own tier fits does a request try tighter
  tiers (nearest first, each by load gradient; a looser request there is safe for its TPOT and
  the check protects the residents); then the tier scales up by pulling in an unassigned
  instance or a "pending" one (an instance holding none of its own tier's requests, whose
  residents all tolerate the new tier; those holding this tier's requests first); then the
  request is served best effort on the least loaded instance and counted as pending.
- Scale-down (§4.3–4.4): an instance with no request of its own tier is pending; once it has
  been so for `release_after_s` and is empty it returns to the pool (`None`). Checked every
  `check_every_s` over all instances (the paper checks the last instance of each tier
  periodically); pending itself is read live from the resident counts.

PD (§4.7 with §4.6): a decode view's queue delay is the prefill partner's predicted finish,
which the prefill chooser already held to `ttft_margin` times the TTFT slack (router/pd.py); the
decode instance then adds the wait for its running pass and the one already formed (overlap),
at the next iteration's length, `ttft_margin` times over, so both halves of a pair share one
TTFT budget. A decode instance whose engine holds transferred requests back (a reported queue)
is at its admission cap and takes no more.

Why the TTFT margin (default 2): the estimate leaves out the pass already formed under SGLang's
overlap schedule and the engine's own prefill deferrals (the prefill gate that protects running
TPOTs), so packing instances to the bare estimate missed TTFTs. Stale reports used to hide this:
placements since the last report counted as queued, which made the check conservative; with
fresh reports a margin of 1 loses attainment that a margin of 2 keeps (simulated).

`on_finished` keeps the per-instance residents exact; as a fallback an instance reporting zero
load forgets the residents placed before that report.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from router.pd import DECODE
from router.pd_sizing import tpot_tier
from router.policies.base import RoutingPolicy, healthy_workers, least_loaded
from router.policies.request_estimates import output_tokens
from router.routing_views import Decision, RouteRequest, WorkerView
from scheduler.core.estimates import DEFAULT_OUTPUT_LEN, token_due
from scheduler.core.registry import require

Tier = float | None  # TPOT tier in ms; None = best-effort pool / no TPOT
_NONE: Counter[Tier] = Counter()  # read-only stand-in for an instance with no residents


@dataclass
class _Placed:
    worker_id: str
    tier: Tier  # the request's own tier
    at: float  # router clock of the placement
    best_effort: bool
    prompt_tokens: int = 0


@dataclass(frozen=True)
class PolyServeParams:
    tiers_ms: tuple[float, ...] | None = None  # TPOT tiers; None: one tier per distinct TPOT
    batch_growth: float = 0.5
    release_after_s: float | None = 10.0  # None: an instance keeps its tier
    check_every_s: float = 0.5
    default_output_tokens: int = DEFAULT_OUTPUT_LEN
    ttft_margin: float = 2.0  # the TTFT estimate must fit this many times over (see the module doc)

    def __post_init__(self) -> None:
        require(self.ttft_margin >= 1.0, "ttft_margin", "must be >= 1", self.ttft_margin)


def _pending(w: WorkerView) -> int:
    """Requests on `w` not yet in its running batch as the router best knows it: its queue, or
    what the router placed there since the last report (a report is up to 0.25 s old; reading
    only the report, load-gradient packing sent every placement in between to one instance)."""
    return max(w.queue_len, w.load - w.running)


class PolyServePolicy(RoutingPolicy):
    name = "polyserve"

    def __init__(self, params: PolyServeParams = PolyServeParams()) -> None:
        self.tiers_ms = tuple(sorted(float(t) for t in params.tiers_ms)) if params.tiers_ms else None
        self.batch_growth = params.batch_growth
        self.ttft_margin = params.ttft_margin
        self.release_after_s = params.release_after_s
        self.check_every_s = params.check_every_s
        self._last_check = -math.inf
        self.default_output_tokens = params.default_output_tokens
        self._tier: dict[str, Tier] = {}  # instance -> tier it serves
        self._placed: dict[str, _Placed] = {}  # rid -> where it went
        self._resident: dict[str, dict[str, Tier]] = {}  # instance -> {rid: request tier}
        self._tiers_on: dict[str, Counter[Tier]] = {}  # instance -> resident requests per tier
        self._idle_since: dict[str, float] = {}  # instance -> since when no own-tier request
        self._stats: dict[Tier, Counter[str]] = {}

    # -- tiers -------------------------------------------------------------------------------

    @property
    def assignments(self) -> dict[str, Tier]:
        """Instance -> TPOT tier (ms) it serves, None for the best-effort pool."""
        return dict(self._tier)

    def tier_of(self, req: RouteRequest) -> Tier:
        tpot = req.slo.tpot_ms
        if tpot is None:
            return None
        if self.tiers_ms is None:
            return float(tpot)
        fitting = [t for t in self.tiers_ms if t <= tpot]
        return fitting[-1] if fitting else self.tiers_ms[0]

    # -- feasibility -------------------------------------------------------------------------

    def next_iteration_s(self, w: WorkerView) -> float:
        """The step a new resident would decode at. An engine with the SLO levers shrinks its
        prefill chunks to keep the tightest resident's TPOT, so its tier holds while the plain
        decode step does; the measured steps (chunks mixed in) would refuse tiers it keeps."""
        if w.slo_levers and w.role != DECODE and w.decode_step_s > 0:
            base = w.decode_step_s
        else:
            base = w.iteration_s if w.iteration_s > 0 else w.decode_s_per_token
        return base * (1.0 + self.batch_growth * (_pending(w) + 1) / max(w.running, 1))

    def fits(self, w: WorkerView, req: RouteRequest, l_out: int, tier_ms: float | None, now: float) -> bool:
        """Can `w` take `req` while keeping its tier's TPOT (`tier_ms`) and the request's TTFT?"""
        if w.load + 1 > w.max_running or w.kv_free_tokens < req.prompt_tokens + l_out:
            return False
        if w.role == DECODE and w.queue_len > 0:
            return False  # transferred requests wait: the engine's admission cap binds already
        first_due = token_due(req.slo, req.arrival_s, 0)
        if first_due is not None:
            if w.role == DECODE:
                # PD: the view's queue delay is the prefill partner's predicted finish, which the
                # prefill chooser already held to the TTFT with its own margin; this instance adds
                # the wait for its current pass and the one already formed (overlap schedule)
                first = w.queue_delay_s + self.ttft_margin * 2.0 * self.next_iteration_s(w)
            else:
                prompts = req.prompt_tokens + self._queued_prompt_tokens(w)
                own = w.queue_delay_s + w.iteration_s + w.prefill_s_per_token * prompts
                first = self.ttft_margin * own
            if now + first > first_due:
                return False
        return tier_ms is None or self.next_iteration_s(w) <= tier_ms / 1000.0

    def _queued_prompt_tokens(self, w: WorkerView) -> int:
        """Prompt tokens queued on `w` ahead of a new request, as the router best knows them: its
        newest `_pending(w)` placements (a queue-delay EMA only learns of a backlog once the
        backlog has been waited out, so packing on it alone overfilled instances, most of all
        with frequent reports)."""
        residents = self._resident.get(w.worker_id)
        pending = _pending(w)
        if not residents or pending <= 0:
            return 0
        placed = self._placed
        newest = list(residents)[-pending:]
        return sum(placed[rid].prompt_tokens for rid in newest)

    # -- routing -----------------------------------------------------------------------------

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        alive = healthy_workers(workers)
        by_tier: dict[Tier, list[WorkerView]] = {}
        assigned = self._tier
        for w in alive:
            if w.worker_id not in assigned:
                assigned[w.worker_id] = w.tpot_tier_ms  # first sight: adopt its configured tier
            by_tier.setdefault(assigned[w.worker_id], []).append(w)
        if now - self._last_check >= self.check_every_s:
            self._last_check = now
            if self._refresh(alive, now):  # some instance went back to the pool: regroup
                by_tier = {}
                for w in alive:
                    by_tier.setdefault(assigned[w.worker_id], []).append(w)
        tier = self.tier_of(req)
        l_out = output_tokens(req, self.default_output_tokens)
        if tier is None:
            w, reason = self._best_effort_request(req, l_out, by_tier, alive, now)
            return self._place(req, w, None, reason, now)

        tpot = float(req.slo.tpot_ms or tier)  # below `tier` only when tighter than every tier
        target = self._gradient(by_tier.get(tier, ()), req, l_out, min(tier, tpot), now)
        if target is not None:
            return self._place(req, target, tier, "tier", now)
        tighter = sorted((t for t in by_tier if t is not None and t < tier), reverse=True)
        for t in tighter:
            target = self._gradient(by_tier[t], req, l_out, min(t, tpot), now)
            if target is not None:
                return self._place(req, target, tier, "promoted", now)
        target = self._scale_up(req, l_out, tier, min(tier, tpot), alive, now)
        if target is not None:
            self._tier[target.worker_id] = tier
            self._idle_since.pop(target.worker_id, None)
            return self._place(req, target, tier, "scaled_up", now)
        target = self._fallback(alive, req, l_out, tier, now)
        return self._place(req, target, tier, "best_effort", now, best_effort=True)

    def _fallback(
        self, alive: Sequence[WorkerView], req: RouteRequest, l_out: int, tier: float, now: float
    ) -> WorkerView:
        """Best effort: the least loaded instance whose residents already need `tier` or tighter
        and that has room for the request (`_has_room`; its step may exceed the tier): an
        SLO-lever engine caps its batch at its tightest resident's TPOT, so a tight request on a
        looser instance shrinks that instance's batch for every resident. In a PD decode pool a
        request behind a full batch is late anyway: then any decode instance with room, then the
        tight ones; else the least loaded instance."""
        tight = [w for w in alive if self._tightest(w.worker_id) <= tier]
        tight_room = [w for w in tight if self._has_room(w, req, l_out, now)]
        if tight_room:
            return least_loaded(tight_room)
        decode_room = [w for w in alive if w.role == DECODE and self._has_room(w, req, l_out, now)]
        if decode_room:
            return least_loaded(decode_room)
        tight_decode = [w for w in tight if w.role == DECODE]
        return least_loaded(tight_decode) if tight_decode else least_loaded(alive)

    def _has_room(self, w: WorkerView, req: RouteRequest, l_out: int, now: float) -> bool:
        """A PD decode instance while nothing waits there: its engine holds a transfer back once
        its batch cap is full, and the request's second token is then late, where a looser
        instance would shrink its batch to the request's TPOT and serve it at once. A co-located
        one if it fits but for its tier's step."""
        if w.role == DECODE:
            return _pending(w) == 0
        return self.fits(w, req, l_out, None, now)

    def _tightest(self, wid: str) -> float:
        residents = self._tiers_on.get(wid, _NONE)
        return min((t for t, n in residents.items() if t is not None and n > 0), default=math.inf)

    def _gradient(
        self, ws: Sequence[WorkerView], req: RouteRequest, l_out: int, tier_ms: float | None, now: float
    ) -> WorkerView | None:
        """Highest-load instance that fits (first in order on ties)."""
        best: WorkerView | None = None
        for w in ws:
            if (best is None or w.load > best.load) and self.fits(w, req, l_out, tier_ms, now):
                best = w
        return best

    def _scale_up(
        self, req: RouteRequest, l_out: int, tier: float, bound_ms: float, alive: Sequence[WorkerView], now: float
    ) -> WorkerView | None:
        """An unassigned or pending instance that can join `tier` and take the request."""
        best: tuple[int, int] | None = None
        chosen: WorkerView | None = None
        for w in alive:
            residents = self._tiers_on.get(w.worker_id, _NONE)
            current = self._tier[w.worker_id]
            if current is not None:
                if residents[current] > 0:
                    continue  # still serving its own tier
                if any(r is not None and r < tier and n > 0 for r, n in residents.items()):
                    continue  # a resident needs a tighter TPOT than `tier` gives
            key = (-residents[tier], w.load)
            if (best is None or key < best) and self.fits(w, req, l_out, bound_ms, now):
                best, chosen = key, w
        return chosen

    def _best_effort_request(
        self,
        req: RouteRequest,
        l_out: int,
        by_tier: dict[Tier, list[WorkerView]],
        alive: Sequence[WorkerView],
        now: float,
    ) -> tuple[WorkerView, str]:
        """No TPOT: the pool first, else the loosest tier that keeps its TPOT, else least loaded."""
        pool = by_tier.get(None)
        if pool:
            return least_loaded(pool), "pool"
        for t in sorted((t for t in by_tier if t is not None), reverse=True):
            w = self._gradient(by_tier[t], req, l_out, t, now)
            if w is not None:
                return w, "borrowed"
        return least_loaded(alive), "least_loaded"

    def _place(
        self, req: RouteRequest, w: WorkerView, tier: Tier, reason: str, now: float, best_effort: bool = False
    ) -> Decision:
        wid = w.worker_id
        self._unplace(req.rid)  # a re-routed rid counts once
        self._placed[req.rid] = _Placed(wid, tier, now, best_effort, req.prompt_tokens)
        self._resident.setdefault(wid, {})[req.rid] = tier
        self._tiers_on.setdefault(wid, Counter())[tier] += 1
        if tier is not None and tier == self._tier.get(wid):
            self._idle_since.pop(wid, None)
        stats = self._stats.setdefault(self._stats_key(tier), Counter())
        stats["routed"] += 1
        stats[reason] += 1
        detail = {"tier_ms": tier or 0.0, "instance_tier_ms": self._tier.get(wid) or 0.0}
        return Decision(wid, reason=reason, best_effort=best_effort, detail=detail)

    def _unplace(self, rid: str) -> None:
        placed = self._placed.pop(rid, None)
        if placed is None:
            return
        self._resident.get(placed.worker_id, {}).pop(rid, None)
        residents = self._tiers_on[placed.worker_id]
        residents[placed.tier] -= 1
        if residents[placed.tier] <= 0:  # a tier no request holds any more takes no room
            del residents[placed.tier]

    # -- bookkeeping -------------------------------------------------------------------------

    def on_finished(self, rid: str, worker_id: str) -> None:
        self._unplace(rid)

    def forget_worker(self, worker_id: str) -> None:
        for rid in list(self._resident.get(worker_id, ())):
            self._unplace(rid)
        for table in (self._tier, self._resident, self._tiers_on, self._idle_since):
            table.pop(worker_id, None)

    def _refresh(self, alive: Sequence[WorkerView], now: float) -> bool:
        """Forget residents of empty instances, track how long each has been pending, release the
        ones pending and empty for `release_after_s`; True when any was released."""
        released = False
        for w in alive:
            wid = w.worker_id
            residents = self._resident.get(wid)
            if residents and w.load == 0:
                for rid in [r for r in residents if self._placed[r].at <= w.last_report_s]:
                    self._unplace(rid)
            tier = self._tier[wid]
            if tier is None:
                continue
            if self._tiers_on.get(wid, _NONE)[tier] > 0:
                self._idle_since.pop(wid, None)
                continue
            since = self._idle_since.setdefault(wid, now)
            if self.release_after_s is not None and w.load == 0 and now - since >= self.release_after_s:
                self._tier[wid] = None
                del self._idle_since[wid]
                self._stats.setdefault(self._stats_key(tier), Counter())["released"] += 1
                released = True
        return released

    def _stats_key(self, tier: Tier) -> Tier:
        """The tier a count is kept under: a configured tier as it is; without configured tiers
        every distinct TPOT is its own tier, so counts go by the fixed grid (pd_sizing.tpot_tier)
        or each client could mint new status entries at will."""
        return tier if tier is None or self.tiers_ms is not None else tpot_tier(tier)

    def _serves_own(self, wid: str) -> bool:
        tier = self._tier.get(wid)
        return tier is not None and self._tiers_on.get(wid, _NONE)[tier] > 0

    def status(self) -> dict[str, object]:
        """Per-tier autoscaling signals for /slo/status: instances, pending instances, requests
        in flight best effort (the tier wants another instance), routed/promoted/scaled-up/
        best-effort/released counts since start."""
        tiers: dict[str, dict[str, int]] = {}
        key = self._stats_key
        keys = {key(t) for t in self._tier.values() if t is not None} | {t for t in self._stats if t is not None}
        for t in sorted(k for k in keys if k is not None):
            s = self._stats.get(t, Counter())
            tiers[f"{t:g}"] = {
                "instances": sum(1 for v in self._tier.values() if v is not None and key(v) == t),
                "pending_instances": sum(
                    1 for wid, v in self._tier.items() if v is not None and key(v) == t and not self._serves_own(wid)
                ),
                "pending": sum(
                    1 for p in self._placed.values() if p.tier is not None and key(p.tier) == t and p.best_effort
                ),
                "routed": s["routed"],
                "promoted": s["promoted"],
                "scaled_up": s["scaled_up"],
                "best_effort": s["best_effort"],
                "released": s["released"],
            }
        pool = self._stats.get(None, Counter())
        return {
            "tiers": tiers,
            "pool_instances": sum(1 for v in self._tier.values() if v is None),
            "no_tpot_routed": pool["routed"],
            "assignments": {wid: t for wid, t in sorted(self._tier.items())},
        }
