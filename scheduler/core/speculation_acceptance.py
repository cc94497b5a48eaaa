"""Draft acceptance α, learned from the engine's verify results.

SLOs-Serve App. D models each drafted token as accepted with probability α, independently, until
the first rejection; a verify of `s` drafted tokens then yields Acc(s) = (1 − α^(s+1)) / (1 − α)
tokens (scheduler.core.slos_serve.spec_length.acceptance).
"""

from __future__ import annotations

from collections.abc import Sequence


def _accepted_and_judged(accepted_per_req: Sequence[int], steps: int) -> tuple[int, int]:
    """A request that accepted `a < s` drafts had `a + 1` judged (the last one rejected); one that
    accepted all `s` had `s` judged and no rejection."""
    clipped = [min(max(int(a), 0), steps) for a in accepted_per_req]
    return sum(clipped), sum(min(a + 1, steps) for a in clipped)


def batch_alpha(accepted_per_req: Sequence[int], steps: int) -> float | None:
    """Maximum-likelihood α of one verify: accepted drafts over drafts actually judged."""
    if steps <= 0 or not accepted_per_req:
        return None
    accepted, judged = _accepted_and_judged(accepted_per_req, steps)
    return accepted / judged if judged else None


class AcceptanceTracker:
    """α as the ratio of two decaying sums, accepted and judged drafts, over recent verifies.

    Pooling counts (not averaging each verify's ratio) keeps it unbiased at batch size 1, where
    a single verify's accepted/judged is biased low; the prior counts as `prior_weight` judged
    drafts, so the first verifies move it only as far as their evidence goes."""

    def __init__(self, prior: float = 0.7, decay: float = 0.98, prior_weight: float = 8.0) -> None:
        if not 0.0 < decay < 1.0:
            raise ValueError("decay must be in (0, 1)")
        self.decay = decay
        self._accepted = prior * prior_weight
        self._judged = prior_weight
        self.alpha = prior
        self.verifies = 0
        self.request_verifies = 0
        self.accepted = 0

    def observe(self, accepted_per_req: Sequence[int], steps: int) -> None:
        if steps <= 0 or not accepted_per_req:
            return
        accepted, judged = _accepted_and_judged(accepted_per_req, steps)
        self.verifies += 1
        self.request_verifies += len(accepted_per_req)
        self.accepted += accepted
        self._accepted = self.decay * self._accepted + accepted
        self._judged = self.decay * self._judged + judged
        self.alpha = self._accepted / self._judged

    def mean_accepted(self) -> float | None:
        """Accepted drafts per request per verify so far (SGLang's accept length is this + 1)."""
        return None if not self.request_verifies else self.accepted / self.request_verifies
