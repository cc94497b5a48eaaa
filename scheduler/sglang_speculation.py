"""Adapter: hands SGLang's speculation length to the SLO controller (scheduler/core/speculation_controller.py).

SGLang 0.5.23's EAGLE v2 worker (and STANDALONE, its subclass) has an `AdaptiveController` that
pre-builds one runtime state (attention backends, buffers) per candidate length and asks its
policy (the `AdaptiveSpecPolicy` protocol) for the length before each decode batch. SGLang creates
it for EAGLE/EAGLE3 only, behind `--speculative-adaptive`, with its acceptance-only policy;
STANDALONE has the same machinery but a `None` controller. We create the controller for both,
with our SLO-driven policy, right after SGLang builds the speculative worker and before it builds
its runtime states.
"""

from __future__ import annotations

import logging
from typing import Any

from scheduler.core.speculation_controller import SloSpeculation

logger = logging.getLogger("sglang_slo.speculation")


def _param_count(runner: Any) -> int:
    model = getattr(runner, "model", None)
    return 0 if model is None else sum(p.numel() for p in model.parameters())


def draft_model_runner(spec_worker: Any) -> Any | None:
    """The draft model's runner of an EAGLE-family v2 worker (None: NGRAM, no draft model)."""
    return getattr(getattr(spec_worker, "_draft_worker", None), "draft_runner", None)


def measured_draft_ratio(spec_worker: Any, target_runner: Any) -> float | None:
    """Draft/target weight count: a decode step reads every weight once, so this is the draft
    step's cost relative to the target's (1.0 for a self-draft)."""
    target, drafted = _param_count(target_runner), _param_count(draft_model_runner(spec_worker))
    return drafted / target if target and drafted else None


def attach_slo_controller(
    spec_worker: Any, candidates: list[int], draft_ratio: float, margin: float = 0.05
) -> SloSpeculation | None:
    """Install the SLO controller on an EAGLE-family worker; None for workers without adaptive
    support (NGRAM), which keep their fixed length."""
    if not hasattr(spec_worker, "adaptive_controller"):
        return None
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController

    initial = int(spec_worker.speculative_num_steps)
    steps = sorted(set(candidates) | {initial})
    # No prefill rides in a verify batch: STANDALONE runs prefill in passes of its own, and in
    # EAGLE's mixed steps the decodes do not draft
    controller = SloSpeculation(steps, draft_ratio, initial=initial, margin=margin, mixed_batches=False)
    spec_worker.adaptive_controller = AdaptiveController(spec_worker, controller)
    logger.info("SLO speculation: candidate lengths %s, draft/target cost %.3f", steps, draft_ratio)
    return controller
