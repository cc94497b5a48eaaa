"""The SLO-driven speculation length: what SGLang's adaptive controller asks each batch.

SGLang's `AdaptiveController` pre-builds one runtime state per candidate length and asks its
policy (the `AdaptiveSpecPolicy` protocol) `get_steps_for_batch(bs)` before every decode, feeding
back `on_verify_complete(accepted_per_req, bs)`. SGLang's own policy picks the length from
acceptance alone. This object has the same interface but picks the length the SLOs-Serve
optimiser gives for the running requests' TPOT tiers (`update`, called by the scheduler each
pass), the measured α and the performance model. It changes length only when the gain is clear
for a while (hysteresis), or at once when the current length would miss a TPOT that another can
keep. It is policy, so it lives in the core as plain Python; the adapter
(scheduler/sglang_speculation.py) is what hands it to SGLang.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

from scheduler.core.estimates import next_token_due
from scheduler.core.slos_serve.spec_length import LengthChoice, Tier, acceptance, best, choose_per_tier, choose_uniform
from scheduler.core.speculation_acceptance import AcceptanceTracker
from scheduler.core.speculation_cost import SpecCost
from scheduler.core.types import EngineView, PerfModel, RequestView

KV_BLOCK_BITS = 8  # the choice is remembered per 256 KV tokens: a decode step's KV term barely moves
MEMO_PASSES = 1024


def effective_tpot_s(r: RequestView, now: float, catch_up_tokens: int, floor: float) -> float | None:
    """A request's TPOT, tightened while it is behind its deadline-based SLO (SLOs-Serve §3.2.3:
    "we strengthen its SLO when a request falls behind"): the debt is repaid over the next
    `catch_up_tokens` tokens, never asking more than `floor` of the TPOT."""
    if r.slo.tpot_ms is None or r.best_effort_tier:
        return None
    tpot = r.slo.tpot_ms / 1000.0
    due = next_token_due(r)
    if due is None or r.first_token_time is None or now <= due:
        return tpot
    return max(tpot * floor, tpot - (now - due) / catch_up_tokens)


def pending_prefill(view: EngineView, up_to: int | None = None) -> int:
    """Prompt tokens still to prefill: the waiting requests' and those running without their
    first token (counted whole: the view does not say how far their chunks have got). `up_to`:
    stop counting once there are that many (a deep queue is not walked to its end)."""
    total = 0
    for r in chain((r for r in view.running if r.first_token_time is None), view.waiting):
        total += max(r.prompt_len - r.prefix_cached, 0)
        if up_to is not None and total >= up_to:
            break
    return total


# The most prefill chunks the decode-only rule counts ahead (`pending_prefill`'s walk stops there).
PENDING_CHUNKS = 8
# Drafting stops once every running request is further ahead of its schedule than this many
# times the prefill in view takes beside the decodes: more prompts keep arriving, each a mixed
# step or more, and catching up again waits out the controller's dwell.
LEAD_MIXED_STEPS = 4.0


def least_lead_s(running: Sequence[RequestView], now: float) -> float | None:
    """How long before its next token is due the running request nearest its deadline-based
    schedule is (negative: behind); None when no running request decodes to a TPOT."""
    leads = [
        due - now
        for r in running
        if r.slo.tpot_ms is not None
        and not r.best_effort_tier
        and r.first_token_time is not None
        and (due := next_token_due(r)) is not None
    ]
    return min(leads, default=None)


def _count_tiers(tpots: Iterable[float | None]) -> list[Tier]:
    counts: dict[float, int] = {}
    for tpot in tpots:
        if tpot is not None:
            key = round(tpot, 4)
            counts[key] = counts.get(key, 0) + 1
    return [Tier(t, n) for t, n in sorted(counts.items())]


def tiers_of(running: Sequence[RequestView], now: float, catch_up_tokens: int, floor: float) -> list[Tier]:
    return _count_tiers(effective_tpot_s(r, now, catch_up_tokens, floor) for r in running)


class SloSpeculation:
    def __init__(
        self,
        candidates: Sequence[int],
        draft_ratio: float,
        initial: int | None = None,
        alpha_prior: float = 0.7,
        margin: float = 0.05,
        dwell: int = 4,
        catch_up_tokens: int = 16,
        tighten_floor: float = 0.25,
        mixed_batches: bool = True,
        draft_for_prefill: bool = False,
        decode_only_drafts: bool = False,
    ) -> None:
        steps = sorted({int(s) for s in candidates})
        if not steps or steps[0] < 0:
            raise ValueError(f"candidate steps must be non-negative ints, got {list(candidates)}")
        self.candidates = steps
        self.draft_ratio = draft_ratio
        self.current = initial if initial in steps else steps[-1]
        self.acceptance = AcceptanceTracker(prior=alpha_prior)
        self.margin = margin
        self.dwell = dwell
        self.catch_up_tokens = catch_up_tokens
        self.tighten_floor = tighten_floor
        self.mixed_batches = mixed_batches  # does prefill ride in verify batches (spec_length)
        self.draft_for_prefill = draft_for_prefill  # draft to buy prefill budget (the paper's gain), see `_target`
        # The engine drafts only in decode-only steps; a step with prefill runs its decodes plain
        # beside it (SGLang's EAGLE with mixed batches): see `_target`.
        self.decode_only_drafts = decode_only_drafts
        self._pending: int | None = None
        self._pending_for = 0
        self.switches = 0
        self.decisions = 0
        self.tightened = 0
        self.last: LengthChoice | None = None
        self.last_best: LengthChoice | None = None
        self.per_tier: LengthChoice | None = None
        self._per_tier_args: tuple[Any, ...] | None = None
        self._memo: dict[tuple[Any, ...], dict[int, LengthChoice]] = {}
        self._memo_perf: PerfModel | None = None
        self._mixed_step_s = 0.0  # the prefill in view (at least a full chunk) beside these decodes
        self._needs_drafts: list[RequestView] = []  # running requests a full mixed step would set back
        self.tiers: list[Tier] = []
        self.steps_used: dict[int, int] = {}  # verifies run at each length
        self._cuda_graph_bs: list[int] | None = None

    # ---- SGLang's AdaptiveSpecPolicy interface -----------------------------------------------
    @property
    def candidate_steps(self) -> list[int]:
        return self.candidates

    def set_cuda_graph_bs(self, cuda_graph_bs: list[int] | None) -> None:
        self._cuda_graph_bs = sorted(cuda_graph_bs) if cuda_graph_bs else None

    def cuda_graph_bs_for_step(self, step: int) -> list[int] | None:
        return self._cuda_graph_bs

    def get_steps_for_batch(self, batch_size: int) -> int:
        return self.current

    def on_verify_complete(self, accepted_per_req: list[int], batch_size: int) -> int | None:
        """α learning only: lengths change in `update`, where the SLOs are known."""
        self.acceptance.observe(accepted_per_req, self.current)
        self.steps_used[self.current] = self.steps_used.get(self.current, 0) + 1
        return None

    # ---- the SLO decision ----------------------------------------------------------------------
    def update(self, view: EngineView, perf: PerfModel) -> int:
        """Re-decide the length for the running requests; returns the length now in force."""
        tpots = [effective_tpot_s(r, view.now, self.catch_up_tokens, self.tighten_floor) for r in view.running]
        self.tiers = _count_tiers(tpots)
        self.tightened = sum(
            1 for r, t in zip(view.running, tpots) if t is not None and t < (r.slo.tpot_ms or 0.0) / 1000.0
        )
        if not self.tiers:
            return self.current  # no TPOT to keep: nothing to trade, stay put
        cost = SpecCost(perf, self.draft_ratio)
        kv = sum(r.prompt_len + r.generated for r in view.running)
        limit = view.chunk_size if view.chunk_size > 0 else 8192
        alpha = round(self.acceptance.alpha, 3)
        mixed = self.mixed_batches
        if self.decode_only_drafts:
            # the prefill the decodes will sit beside: what waits (a burst of long prompts is
            # many mixed steps in a row), at least a full chunk (an arrival's)
            pending = pending_prefill(view, up_to=PENDING_CHUNKS * limit)
            prefill = max(limit, pending)
            self._mixed_step_s = perf.step_time(prefill, len(view.running), kv)
            # A request whose (tightened) TPOT outlasts the mixed steps ahead (what waits, else a
            # prompt the size of the running ones: one chunk at most) keeps its schedule on
            # every step: drafting cannot help it, and its longer decode-only steps delay every
            # arrival's prefill.
            typical = sum(r.prompt_len for r in view.running) // max(len(view.running), 1)
            next_mixed_s = perf.step_time(min(limit, max(pending, typical)), len(view.running), kv)
            longest = next_mixed_s * (1.0 + self.margin)
            self._needs_drafts = [r for r, t in zip(view.running, tpots) if t is not None and t < longest]
        choices = self._choices(cost, alpha, kv, limit)
        self._per_tier_args = (cost, self.tiers, alpha, kv, limit, mixed)
        self.per_tier = None  # the paper's per-tier optimum: only reported, computed on demand
        winner = best(choices)
        self.last_best = winner
        self.decisions += 1
        if winner is None:
            return self.current
        self._consider(self._target(winner, choices, view), choices[self.current])
        self.last = choices[self.current]
        return self.current

    def _choices(self, cost: SpecCost, alpha: float, kv: int, limit: int) -> dict[int, LengthChoice]:
        """Every candidate evaluated, remembered per (tiers, α, KV in blocks, limit): the same
        batch is asked about every pass, and its answer moves only with those. Forgotten when the
        perf model is another object and every `MEMO_PASSES` decisions, so a model that learns
        in place is read again."""
        if cost.perf is not self._memo_perf or self.decisions % MEMO_PASSES == 0 or len(self._memo) > 512:
            self._memo, self._memo_perf = {}, cost.perf
        key = (tuple(self.tiers), alpha, kv >> KV_BLOCK_BITS, limit)
        choices = self._memo.get(key)
        if choices is None:
            kv_at = (kv >> KV_BLOCK_BITS) << KV_BLOCK_BITS  # the key's KV, so a hit is the same answer
            choices = choose_uniform(cost, self.tiers, alpha, self.candidates, kv_at, limit, self.mixed_batches)
            self._memo[key] = choices
        return choices

    def _target(self, winner: LengthChoice, choices: dict[int, LengthChoice], view: EngineView) -> LengthChoice:
        """Drafting must pay to be chosen. By default it is chosen only where the TPOTs bind:
        the shortest candidate (no drafting, where 0 is a candidate) cannot keep them. With
        `draft_for_prefill` (SLOs-Serve's objective) also where a longer batch buys more prefill
        budget: the best length, unless no drafting comes within the margin of it or already
        has room for all the prefill that is waiting (counted only then: a walk of the queue).
        In the simulated SLOs-Serve mixes the budget a longer batch buys did not pay for the longer passes, which
        every arrival's TTFT waits out, so that is not the default."""
        base = choices[self.candidates[0]]
        if not base.feasible:
            return winner  # the TPOTs bind: no drafts cannot keep them
        if self.decode_only_drafts:
            lead = least_lead_s(self._needs_drafts, view.now)
            if lead is None or lead >= LEAD_MIXED_STEPS * self._mixed_step_s:
                return base  # the schedules outlast the prefill in view (`_fastest_per_token`)
            return self._fastest_per_token(choices, base)
        if not self.draft_for_prefill:
            return base
        small_gain = winner.prefill_rate <= base.prefill_rate * (1.0 + self.margin)
        if small_gain or pending_prefill(view) <= base.prefill_budget:
            return base
        return winner

    def _per_token_s(self, choice: LengthChoice) -> float:
        """Decode seconds per token a request gains at this length: its verify (and drafts) over Acc(s)."""
        return choice.exec_time_s / acceptance(choice.steps, self.acceptance.alpha)

    def _fastest_per_token(self, choices: dict[int, LengthChoice], base: LengthChoice) -> LengthChoice:
        """Where drafting happens only in decode-only steps it takes no prefill's time, and every
        token a decode banks ahead of its deadline-based schedule is slack for the longer mixed
        steps. So the length with the least decode time per token, where it beats no drafting by
        the margin (the verify grows with the batch: a compute-bound batch gains nothing and
        stays at no drafting). Only while some running request whose TPOT is shorter than the
        next mixed step is nearer its next token's due time than a few times what the prefill
        in view takes beside the decodes (what waits, at least one full chunk: `update`,
        `LEAD_MIXED_STEPS`): with more slack than that, or a longer TPOT, the mixed steps keep
        the TPOTs unaided, and a longer decode-only step only delays the next prefill, which
        every arrival's TTFT waits out."""
        feasible = [c for c in choices.values() if c.feasible]
        fastest = min(feasible, key=lambda c: (self._per_token_s(c), c.steps))
        return fastest if self._per_token_s(fastest) * (1.0 + self.margin) < self._per_token_s(base) else base

    def _consider(self, winner: LengthChoice, now: LengthChoice) -> None:
        if winner.steps == self.current:
            self._pending, self._pending_for = None, 0
            return
        if winner.feasible and not now.feasible:
            self._switch(winner.steps)  # the current length misses a TPOT another keeps: now
            return
        if self.decode_only_drafts:  # the gain is time per token (`_fastest_per_token`)
            clear_gain = self._per_token_s(winner) * (1.0 + self.margin) < self._per_token_s(now)
        else:
            clear_gain = winner.prefill_rate > now.prefill_rate * (1.0 + self.margin)
        shorter = winner.steps < now.steps  # drafting does not pay (`_target`): back off
        if not clear_gain and not shorter and now.feasible:
            self._pending, self._pending_for = None, 0
            return
        if self._pending != winner.steps:
            self._pending, self._pending_for = winner.steps, 0
        self._pending_for += 1
        if self._pending_for >= self.dwell:
            self._switch(winner.steps)

    def _switch(self, steps: int) -> None:
        self.current = steps
        self.switches += 1
        self._pending, self._pending_for = None, 0

    def per_tier_optimum(self) -> LengthChoice | None:
        """SLOs-Serve App. D's per-tier lengths for the last decision's tiers (reported only:
        SGLang verifies one length per batch), computed when asked, not every pass."""
        if self.per_tier is None and self._per_tier_args is not None:
            cost, tiers, alpha, kv, limit, mixed = self._per_tier_args
            self.per_tier = choose_per_tier(cost, tiers, alpha, self.candidates, kv, limit, mixed)
        return self.per_tier

    def tokens_per_verify(self) -> float:
        """Acc(s) at the current length: how many TPOTs one batch may take."""
        return acceptance(self.current, self.acceptance.alpha)

    def status(self) -> dict[str, Any]:
        def brief(c: LengthChoice | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {
                "steps": c.steps,
                "batch_time_ms": round(1000 * c.batch_time_s, 3),
                "prefill_budget": c.prefill_budget,
                "prefill_tokens_per_s": round(c.prefill_rate, 1),
                "feasible": c.feasible,
            }

        per_tier = self.per_tier_optimum()
        return {
            "steps": self.current,
            "candidate_steps": self.candidates,
            "alpha": round(self.acceptance.alpha, 4),
            "decode_only_drafts": self.decode_only_drafts,
            "mean_accepted_drafts": self.acceptance.mean_accepted(),
            "verifies": self.acceptance.verifies,
            "steps_used": {str(k): v for k, v in sorted(self.steps_used.items())},
            "tokens_per_verify": round(self.tokens_per_verify(), 3),
            "draft_ratio": self.draft_ratio,
            "tiers": [{"tpot_ms": round(1000 * t.tpot_s, 2), "requests": t.requests} for t in self.tiers],
            "tightened_requests": self.tightened,
            "switches": self.switches,
            "decisions": self.decisions,
            "current": brief(self.last),
            "best_uniform": brief(self.last_best),
            "per_tier_optimum": None
            if per_tier is None
            else {
                **(brief(per_tier) or {}),
                "lengths": {str(round(1000 * k, 2)): v for k, v in per_tier.per_tier.items()},
            },
        }
