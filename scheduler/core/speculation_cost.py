"""What a speculative step costs: the target's verify pass plus the draft model's steps.

SLOs-Serve §3.1.1 charges speculation as k2·#SpecStep on top of the token term. We make the
draft term explicit: each draft step is a decode pass of the draft model over the same requests,
`draft_ratio` times the target's decode pass (≈ draft/target weight bytes, since a decode step is
memory-bound; 1.0 for a self-draft). The target's perf model then only ever sees target work.
"""

from __future__ import annotations

from scheduler.core.perf_model import PerfModel, StepTimeModel


class SpecCost:
    """The batch cost the speculation-length optimiser takes (its `SpecStepCost`)."""

    def __init__(self, perf: PerfModel, draft_ratio: float) -> None:
        if draft_ratio < 0:
            raise ValueError("draft_ratio must be >= 0")
        self.perf = perf
        self.draft_ratio = draft_ratio

    def draft_time(self, decode_reqs: int, kv_tokens: int, draft_steps: int) -> float:
        if decode_reqs <= 0 or draft_steps <= 0 or self.draft_ratio == 0:
            return 0.0
        return draft_steps * self.draft_ratio * self.perf.step_time(0, decode_reqs, kv_tokens)

    def step_time(
        self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int, draft_steps: int
    ) -> float:
        """One batch: `spec_tokens` drafted tokens verified on top of one token per decode, after
        `draft_steps` sequential draft passes."""
        verify = self.perf.step_time(prefill_tokens, decode_reqs, kv_tokens, spec_tokens)
        return verify + self.draft_time(decode_reqs, kv_tokens, draft_steps)

    def at_steps(self, steps: int) -> AtSteps:
        return AtSteps(self, steps)


class AtSteps(StepTimeModel):
    """The perf-model interface for batches where every decode drafts `steps` tokens, so the
    batch-cap and chunk searches written for plain decoding apply unchanged."""

    def __init__(self, cost: SpecCost, steps: int) -> None:
        self.cost = cost
        self.steps = max(int(steps), 0)

    def step_time(self, prefill_tokens: int, decode_reqs: int, kv_tokens: int, spec_tokens: int = 0) -> float:
        return self.cost.step_time(prefill_tokens, decode_reqs, kv_tokens, decode_reqs * self.steps, self.steps)
