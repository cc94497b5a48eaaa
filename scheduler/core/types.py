"""What a policy sees (views) and what it decides (a plan).

The adapter (inside SGLang's scheduler), the emulator and the simulator all build these same
small dataclasses, so one policy object runs unchanged in all three. A policy never sees a
request's true output length: only what was generated so far and a predicted bound. What is
estimated from a view (deadlines, length bounds) lives in scheduler.core.estimates.
"""

from __future__ import annotations

from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from scheduler.core.columns import PassColumns, PassRows
from scheduler.core.perf_model import PerfModel as PerfModel  # re-exported: policies see it with the views
from scheduler.core.request_view import RequestView as RequestView  # re-exported: what a policy sees


@dataclass
class EngineView:
    now: float
    waiting: Sequence[RequestView]
    running: Sequence[RequestView]
    max_running_requests: int
    chunk_size: int  # the start-up prefill chunk size: a plan never exceeds it
    free_kv_tokens: int
    total_kv_tokens: int
    step: int = 0  # scheduling steps taken so far (quanta, frames)
    # Where the engine keeps these views' numbers current, if it does (columns.PassRows): a
    # pass then reads no view for its columns.
    known_rows: PassRows | None = field(default=None, repr=False, compare=False)
    # This pass's columns, shared by every reader while plan_path.plan_pass has them open
    # (pass_columns.sharing): set on the view, never passed to the constructor or copied by
    # `replace`, so a view made from this one reads its own.
    pass_columns: PassColumns | None = field(default=None, init=False, repr=False, compare=False)


@dataclass
class StepPlan:
    """A policy's decision for one scheduling step; None means "leave SGLang's choice"."""

    order: list[str] | None = None  # waiting rids, most urgent first
    # waiting rids declined by admission; a frozenset is finished as it is, without a copy
    best_effort: Set[str] = field(default_factory=set)
    drop: dict[str, str] = field(default_factory=dict)  # rid -> reason (e.g. slo_queue_timeout)
    batch_cap: int | None = None  # running-batch cap for this step
    chunk_size: int | None = None  # prefill chunk budget for this step
    preempt: list[str] = field(default_factory=list)  # running rids to retract (resume later)
    spec_steps: int | None = None  # speculation length for this batch
    # `order` and `best_effort` as positions in view.waiting, where the policy ranked positions
    # (Tempo, GMAX): the engine that made the view then applies the order without rid lookups
    order_at: np.ndarray | None = field(default=None, compare=False)
    best_effort_at: np.ndarray | None = field(default=None, compare=False)


class Policy(Protocol):
    name: str
    # True: the engine sizes the batch cap, prefill chunk and prefill gate this policy's plans
    # leave open to keep SLOs (scheduler/core/plan_path.py); False: an ordering baseline on a
    # stock engine
    slo_levers: bool

    def plan(self, view: EngineView) -> StepPlan: ...
