"""The server's SLO settings, shared by the HTTP process and the scheduler process (a worker's
membership in a router's pool is the HTTP process's alone: server/sglang_http.py).

SGLang spawns the scheduler with only its own ServerArgs, so our settings travel in one
environment variable that spawned children inherit.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR
from scheduler.core.fairness import DEFAULT_TENANT_FAIRNESS
from scheduler.core.slo import SloSpec, parse_slo

ENV_VAR = "SGLANG_SLO_CONFIG"


@dataclass
class SloServerConfig:
    policy: str = "edf"
    policy_params: dict[str, Any] = field(default_factory=dict)
    default_slo: dict[str, Any] | None = None  # applied to requests that carry no SLO
    status_address: str = ""  # ZMQ address the scheduler publishes its status on
    status_interval_s: float = 0.1  # as fresh as the router agent's load reports
    length_predictor: str | None = (
        DEFAULT_LENGTH_PREDICTOR  # scheduler.core.analyzer.spec: history[:Q], none or an artifact
    )
    predictor_quantile: float | None = None  # overrides the artifact's bound quantile (QRF)
    program_patterns: str | None = None  # seed pattern library for compound sub-deadlines
    perf_profile: str | None = None  # GPU+model profile used as is (else learned online)
    emulate_profile: str | None = None  # pace every forward pass to this GPU+model profile
    emulate_name: str | None = None  # e.g. "h100/llama3-8b", for status and logs
    emulate_slowdown: float = 1.0  # emulated steps (and the policies' perf model) this many times longer
    emulate_stand_in: bool = False  # emulated steps skip the tiny model's layers (scheduler/sglang_emulated_forward.py)
    emulate_draft_acceptance: float = 0.8  # emulated speculation: P(a drafted token is accepted)
    speculation: dict[str, Any] | None = None  # SLO-adaptive speculation: {"candidates", "margin"}
    spec_draft_ratio: float | None = None  # draft step / target decode step (None: measured weights)
    max_queued_tokens: int | None = None  # bound on the queued requests' prompt tokens (429 beyond)
    drain_timeout_s: float = 30.0  # SIGTERM: how long requests in flight may finish before the exit
    tenant_fairness: float = DEFAULT_TENANT_FAIRNESS  # f of the fair-share blend between API keys (0: none)

    def default_spec(self) -> SloSpec | None:
        return None if not self.default_slo else parse_slo(self.default_slo, prefix="--slo-default-")

    def to_env(self) -> None:
        os.environ[ENV_VAR] = json.dumps(asdict(self))

    @classmethod
    def from_env(cls) -> SloServerConfig:
        raw = os.environ.get(ENV_VAR)
        return cls(**json.loads(raw)) if raw else cls(policy="fcfs")
