"""The scheduler's status, published to the HTTP process for /slo/status, /metrics and the
router's load reports. The keys are part of that contract: renaming one breaks readers."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class SchedulerStatus:
    policy: str
    waiting: int
    running: int
    max_running_requests: int  # configured, not a decode cap's per-pass value
    disaggregation_mode: str  # null | prefill | decode
    chunked_prefill_size: int | None  # this pass's prefill budget
    steps: int
    kv_capacity_tokens: int
    kv_used_tokens: int | None
    prefill_ms_per_token: float  # what the router's routing policies charge per prompt token
    dropped_in_queue: int
    prefill_deferred: int  # passes that decoded because no prefill fitted the running requests' slack
    prefill_alone: int  # passes whose prefill ran without the decodes, which had the slack to wait
    batch_cap: int | None
    prefill_tokens: int | None  # the plan's prompt tokens per step; the chunk adds riding decodes
    startup_chunk_size: int | None
    chunk_budget: int | None
    dynamic_chunking: dict[str, int] | None
    decode_cap: int | None
    mixed_batching: bool
    best_effort_waiting: int
    held_waiting: int  # best-effort-tier requests past due, held while SLO work runs (last pass)
    lost_held_passes: int  # passes that held at least one
    perf_model: dict[str, Any]
    predictor_accuracy: dict[str, Any] | None
    compound: dict[str, int]
    plan_errors: int  # decisions that raised (policy, speculation length, chunk rule, a TP leader's pass)
    preempted: int
    emulation: dict[str, Any] | None
    speculation: dict[str, Any] | None
    length_predictor: dict[str, Any] | None
    queue_drain_s: float | None = None  # predicted seconds until everything queued now has started
    # The perf model's plain decode step at the running batch and its KV: the router's admission
    # plans batches from it (the measured token gaps also carry the prefill mixed into each step).
    decode_step_ms: float | None = None
    slo_levers: bool = False  # steps sized to the tightest resident's TPOT (the router's tier check reads it)
    shed: dict[str, int] = field(default_factory=dict)  # requests shed, by public reason
    intake_lag: dict[str, Any] | None = None  # HTTP edge -> scheduler intake, ms (IntakeLag)
    max_queued_requests: int | None = None
    max_queued_tokens: int | None = None
    max_input_tokens: int | None = None  # the longest prompt the model takes (the router checks it)
    fallbacks: int = 0  # passes scheduled by SGLang's own choice because our decision failed
    planned_passes: int = 0  # passes whose order and admission came from the policy's plan
    budget_fallbacks: int = 0  # planned passes whose policy search ran out of budget (its fallback plan)
    view_cached_prefix_tokens: int = 0  # cached prefix tokens the policy's views read (per read)
    time: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["chunk_size"] = self.chunked_prefill_size  # older readers' name for the same value
        return out
