"""Speculative decoding on a simulated engine: an acceptance model and the length in force.

Acceptance (SLOs-Serve App. D): each drafted token is accepted with probability α, independently,
until the first rejection, so a verify of s drafts yields min(G, s) accepted, G geometric. The
true α is the draft's quality on the workload (a parameter: SLOs-Serve's OPT-125m/OPT-7B pair and
EAGLE heads on Llama-3-8B sit around 0.6-0.8); the engine never sees it, only the verify results.

Lengths, as the server runs them (scheduler/sglang_scheduler.py): `fixed:S` drafts S tokens in
every decode (SGLang's own speculation, levers sized as without it); `slo` is the SLO-adaptive
controller itself (scheduler/core/speculation_controller.py), fed every verify's accepted counts and asked
every pass, with levers sized on the speculative cost at its length (EngineMeter.lever_model).
Every step costs the target's verify pass plus `draft_ratio` x its decode pass per draft step
(scheduler/core/speculation_cost.py).

Where prefill goes (`LAYOUTS`), as SGLang 0.5.23 resolves it: STANDALONE and NGRAM run prefill
in passes of their own (`apart`); EAGLE and EAGLE3 keep mixed batches, and a step that carries
prefill runs its decodes without drafts (`decode-only`); SLOs-Serve's design rides prefill in
the verify batch (`in-verify`), which SGLang does not do.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from scheduler.core.plan_path import LeverModel
from scheduler.core.slos_serve.spec_length import acceptance
from scheduler.core.speculation_controller import SloSpeculation
from scheduler.core.speculation_cost import SpecCost
from scheduler.core.types import EngineView, PerfModel

SLO_CANDIDATES = (0, 1, 2, 3, 4)
APART, DECODE_ONLY, IN_VERIFY = "apart", "decode-only", "in-verify"
LAYOUTS = (APART, DECODE_ONLY, IN_VERIFY)


class SimSpeculation:
    """The `scheduler.core.sim_engine.Speculation` hook of one engine."""

    def __init__(self, mode: str, alpha: float, draft_ratio: float, seed: int = 0, layout: str = APART) -> None:
        if not 0.0 <= alpha < 1.0:
            raise ValueError(f"acceptance alpha must be in [0, 1), got {alpha}")
        if layout not in LAYOUTS:
            raise ValueError(f"speculation layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
        self.decode_only = layout == DECODE_ONLY
        self.alpha = alpha
        self.draft_ratio = draft_ratio
        self.rng = np.random.default_rng(seed)
        self.controller: SloSpeculation | None = None
        self.fixed = 0
        if mode == "slo" or mode.startswith("slo:"):
            top = int(mode.partition(":")[2] or SLO_CANDIDATES[-1])
            self.controller = SloSpeculation(
                range(top + 1),
                draft_ratio,
                initial=top,
                mixed_batches=layout == IN_VERIFY,
                decode_only_drafts=self.decode_only,
            )
        elif mode.startswith("fixed:"):
            self.fixed = int(mode.partition(":")[2])
        else:
            raise ValueError(f"speculation mode {mode!r}: expected fixed:S, slo or slo:S")

    def steps(self) -> int:
        return self.controller.current if self.controller is not None else self.fixed

    def lever_model(self, plan_perf: PerfModel) -> LeverModel:
        steps = self.steps()
        if self.controller is None or steps <= 0:
            return LeverModel(plan_perf)
        alpha = self.controller.acceptance.alpha
        return LeverModel(SpecCost(plan_perf, self.draft_ratio).at_steps(steps), acceptance(steps, alpha))

    def step_time(self, pace: PerfModel, prefill_tokens: int, decodes: int, kv_tokens: int, steps: int) -> float:
        if steps <= 0 or decodes <= 0:
            return pace.step_time(prefill_tokens, decodes, kv_tokens)
        return SpecCost(pace, self.draft_ratio).step_time(prefill_tokens, decodes, kv_tokens, decodes * steps, steps)

    def accept(self, decodes: int, steps: int) -> Sequence[int]:
        drawn = np.minimum(self.rng.geometric(1.0 - self.alpha, size=decodes) - 1, steps).tolist()
        if self.controller is not None:
            self.controller.on_verify_complete(drawn, decodes)
        return drawn

    def update(self, view: EngineView, plan_perf: PerfModel) -> None:
        if self.controller is not None:
            self.controller.update(view, plan_perf)


def check_mode(mode: str) -> str:
    """`mode` if it names a speculation setting (`none`, `fixed:S`, `slo`, `slo:S`); else an
    argparse error saying what is expected, so a command rejects the flag before it simulates."""
    if mode != "none":
        try:
            SimSpeculation(mode, 0.0, 0.0)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return mode


def check_modes(text: str) -> list[str]:
    """A comma-separated list of speculation settings, each checked; at least one."""
    modes = [check_mode(m.strip()) for m in text.split(",") if m.strip()]
    if not modes:
        raise argparse.ArgumentTypeError("expected at least one of none, fixed:S, slo, slo:S")
    return modes


def add_speculation_flags(group: argparse._ActionGroup, *, several: bool = False) -> None:
    """The speculation flags the simulator and the capacity planner share (one definition, so
    they read alike); `several`: --speculation takes a comma-separated list, each one planned."""
    group.add_argument(
        "--speculation",
        type=check_modes if several else check_mode,
        default=["none"] if several else "none",
        help="none, fixed:S, slo or slo:S"
        + (" (comma-separated: the pools are planned under each)" if several else ""),
    )
    group.add_argument("--spec-alpha", type=float, default=0.7, help="the draft's true acceptance rate")
    group.add_argument("--draft-ratio", type=float, default=0.1, help="draft step cost / target decode step")
    group.add_argument(
        "--spec-layout",
        choices=LAYOUTS,
        default=APART,
        help="where prefill goes: apart (STANDALONE), decode-only (EAGLE: steps with prefill do not draft), "
        "in-verify (SLOs-Serve's design, not SGLang's)",
    )
