"""The adapter's mutable state, kept apart from its wired components: what the engine started
with, the scheduling pass in progress with the plan applied to it, and the counters /slo/status
publishes. Each has one writer (SGLang's init, the pass's plan application, the events counted),
so a reader can tell which values a hook may trust at which point of a pass."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from scheduler.components.intake_lag import IntakeLag


@dataclass
class EngineStart:
    """What SGLang's scheduler started with (set once its init is done)."""

    startup_chunk: int | None = None  # the start-up chunked_prefill_size: a plan never exceeds it
    chunk_budget: int | None = None  # the chunk a pass plans with (PD prefill: the dynamic B)
    max_running: int = 0  # configured max_running_requests; a decode cap lowers it per pass


@dataclass(frozen=True)
class AppliedPlan:
    """The plan of the pass in progress as applied on SGLang's scheduler: the one object the
    hooks read back (the prefill adder's admission limit, the held requests set aside during
    admission, the decode retraction, the deferred prefill, /slo/status). Replaced whole, never
    edited in place, so no hook sees half a plan.

    Across passes (`next_pass`) some levers keep their value and others are reset, as SGLang's
    own settings do:
    - kept: `batch_cap` and `prefill_tokens` (the last plan's, a pass without a plan leaves the
      engine as it was), `decode_cap` (set by every PD decode pass, whose loop has no other);
    - reset: `prefill_open` (True), `prefill_alone` (False), `hold` and `hold_at` (none),
      `preempt` (none: a plan's preemptions hold for its own pass only), `solo_pass` (False).
    """

    batch_cap: int | None = None  # running-batch cap (None: SGLang's own)
    prefill_tokens: int | None = None  # the plan's prefill budget per step (None: SGLang's own)
    prefill_open: bool = True  # False: the plan deferred prefill, this pass decodes
    prefill_alone: bool = False  # True: this pass's prefill runs unmixed, the decodes wait it out
    hold: frozenset[str] = frozenset()  # waiting rids this pass's plan keeps from starting (lost_hold)
    hold_at: np.ndarray | None = field(default=None, compare=False)  # their queue positions, if known
    preempt: frozenset[str] = frozenset()  # running rids to retract, taken once by update_running_batch
    solo_pass: bool = False  # PD prefill: this admission finishes one request whole, alone
    decode_cap: int | None = None  # PD decode: admission cap at the last pass

    def next_pass(self) -> AppliedPlan:
        """The state a new pass starts from, before its plan (if any) is applied."""
        return AppliedPlan(batch_cap=self.batch_cap, prefill_tokens=self.prefill_tokens, decode_cap=self.decode_cap)


@dataclass
class PassState:
    """The scheduling pass in progress: its number, its applied plan, and the queue's predicted
    drain (a newcomer's wait), recomputed at most once per pass."""

    step: int = 0
    applied: AppliedPlan = field(default_factory=AppliedPlan)
    drain_s: float | None = None
    drain_step: int = -1
    drain_at: float = float("-inf")  # time.monotonic() of the last estimate

    def begin(self) -> None:
        """A new prefill pass: the next step, the levers carried over (AppliedPlan.next_pass)."""
        self.step += 1
        self.applied = self.applied.next_pass()


@dataclass
class SloCounters:
    """What the adapter counts for /slo/status."""

    dropped: int = 0
    prefill_deferred: int = 0  # passes the plan turned into decode passes
    prefill_alone: int = 0  # passes whose prefill ran without the decodes (their slack allowed)
    preempted: int = 0
    planned_passes: int = 0  # passes whose order and admission came from the policy's plan
    best_effort_waiting: int = 0  # at the last planned pass
    held_waiting: int = 0  # of those, past due and held while SLO work runs (last planned pass)
    lost_held_passes: int = 0  # passes that held at least one
    shed: Counter[str] = field(default_factory=Counter)  # public shed reason -> requests
    intake: IntakeLag = field(default_factory=IntakeLag)  # edge stamp -> scheduler intake
