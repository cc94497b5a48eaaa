"""This pass's plan: the policy's decision, finished on the one plan path."""

from __future__ import annotations

import logging

from scheduler.core.columns import RowCache
from scheduler.core.fairness import FairShare
from scheduler.core.plan_path import FinalPlan, LeverModel, PlanSettings, plan_pass
from scheduler.core.types import EngineView, PerfModel, Policy

logger = logging.getLogger("sglang_slo.scheduler")


class PassPlanner:
    """A policy bug must not take the engine down: such a pass keeps SGLang's own choice, and
    is counted and logged."""

    def __init__(self, policy: Policy, settings: PlanSettings) -> None:
        self.policy = policy
        self.settings = settings
        self.errors = 0  # exceptions in the policy (and, counted by the adapter, its other decisions)
        self.fallbacks = 0  # passes left to SGLang's own choice because the plan failed
        # The views come from the adapter's ViewBuilder, which keeps RowCache's contract.
        self.row_cache = RowCache()
        self.fair = FairShare()  # tenants' served-token counters across passes

    def plan(
        self, view: EngineView, lever_model: LeverModel | None, wait_model: PerfModel | None = None
    ) -> FinalPlan | None:
        try:
            return plan_pass(view, self.policy, self.settings, lever_model, wait_model, self.row_cache, self.fair)
        except Exception:
            self.errors += 1
            self.fallbacks += 1
            logger.exception("SLO policy %s failed at step %d", self.policy.name, view.step)
            return None

    @property
    def budget_fallbacks(self) -> int:
        """Passes whose policy ran out of its search budget and planned its fallback (a valid
        plan, applied; unlike `fallbacks`, SGLang's own choice is not involved)."""
        return getattr(self.policy, "budget_fallbacks", 0)
