"""One scheduling decision per pass for every rank of a tensor-parallel group.

SGLang runs one scheduler per TP rank, and every rank must build the same batch each pass, or
the forward's collectives mismatch (an NCCL error or a hang). Stock SGLang's choices are
functions of state all ranks share. A policy's are not: it reads the clock, and the perf model
each rank learns from its own timings. So the group's first rank decides and sends the decision
over SGLang's CPU (gloo) group; the others apply it verbatim. With attention data parallelism the
group is one attention-DP replica's TP group: each replica has its own queue and decides alone.

Every rank calls `decide` at the same points of a pass (each call is one collective), so a rank
never skips a call on a condition the others might not share.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from scheduler.core.plan_path import FinalPlan

logger = logging.getLogger("sglang_slo.scheduler")

T = TypeVar("T")


@dataclass(frozen=True)
class PassDecision:
    """What a pass's plan and speculation choice leave to apply; data only, so it pickles."""

    plan: FinalPlan | None = None  # None: SGLang's own choice this pass
    spec_steps: int | None = None  # the speculation length in force (None: no SLO speculation)


class PassSync:
    """`broadcast(value)`: the leader's value on every rank (the leader passes its own, the
    others anything). None: a group of one, nothing to share."""

    def __init__(self, broadcast: Callable[[Any], Any] | None = None, leader: bool = True) -> None:
        self._broadcast = broadcast
        self.leader = leader
        self.shared = 0  # decisions sent (leader) or received (others)
        self.failed = 0  # leader: decisions that raised, so the group kept SGLang's own choice

    def decide(self, choose: Callable[[], T], fallback: T) -> T:
        """The leader's `choose()`, on every rank. A leader whose choice fails sends `fallback`
        (the others are already waiting for a value)."""
        if self._broadcast is None:
            return choose()
        value = fallback
        if self.leader:
            try:
                value = choose()
            except Exception:
                logger.exception("SLO decision failed on the leading rank: the group keeps SGLang's choice")
                self.failed += 1
                value = fallback
        value = self._broadcast(value)
        self.shared += 1
        return value
