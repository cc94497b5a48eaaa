"""What a policy sees (views) and what it decides (a plan).

The adapter (inside SGLang's scheduler), the emulator and the simulator all build these same
small dataclasses, so one policy object runs unchanged in all three. A policy never sees a
request's true output length: only what was generated so far and a predicted bound. What is
estimated from a view (deadlines, length bounds) lives in scheduler.core.estimates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np

from scheduler.core.perf_model import PerfModel as PerfModel  # re-exported: policies see it with the views
from scheduler.core.slo import SloSpec

if TYPE_CHECKING:
    from scheduler.core.columns import PassRows


@dataclass
class RequestView:
    """One request as a policy sees it. Engines keep a view across passes and refresh only
    generated, prefix_cached, first_token_time, predicted_output_len, attained_service and
    best_effort_tier; the other fields never change once the view exists (a request whose
    static fields change gets a new view), which columns.RowCache relies on."""

    rid: str
    slo: SloSpec
    arrival: float  # seconds, same domain as the injected clock
    prompt_len: int
    generated: int = 0  # output tokens produced so far
    max_new_tokens: int | None = None  # the client's cap, not the true length
    predicted_output_len: float | None = None  # the analyzer's bound, if any
    first_token_time: float | None = None
    prefix_cached: int = 0  # prompt tokens already in the KV cache
    program_arrival: float | None = None  # compound: arrival of the program's first call
    stage_deadline: float | None = None  # compound: absolute sub-deadline φ(s)·D, if known
    attained_service: float = 0.0  # LAS: tokens (prefill+decode) served to its program so far
    best_effort_tier: bool = False  # declined by admission, runs on leftover budget
    oracle_output_len: int | None = None  # true length: filled only for *_oracle policies
    tenant: str | None = None  # the API key it came with (fair shares between keys); None: no key
    share: float = 1.0  # that key's share of contended capacity

    @property
    def started(self) -> bool:
        return self.first_token_time is not None


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


@dataclass
class StepPlan:
    """A policy's decision for one scheduling step; None means "leave SGLang's choice"."""

    order: list[str] | None = None  # waiting rids, most urgent first
    best_effort: set[str] = field(default_factory=set)  # waiting rids declined by admission
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
