"""What the load generator observed for one request: the only input of metrics and reports.

Times are seconds since the run's start (the generator's t0), so records of different runs
and servers compare directly and serialise to JSON as plain numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.workloads.traces import TraceRequest


@dataclass(frozen=True)
class PlannedRequest:
    """A trace request with the SLO the mix gave it: what the load generator sends."""

    req: TraceRequest  # lengths, arrival, program / parents / think time
    cls: str  # "latency" | "deadline" | "compound" | "throughput" | "none"
    slo: dict[str, Any]  # the SLO body to send (scheduler.core.slo_wire field names); {} = no SLO
    program_deadline_ms: float | None = None  # compound: the whole program's deadline from its first send


@dataclass
class RequestRecord:
    key: str  # unique in a run: "r12" for a single request, "p3.s1.0" for program 3, stage 1, call 0
    cls: str  # SLO class sent: "latency" | "deadline" | "compound" | "throughput" | "none"
    slo: dict[str, Any]  # the SLO body as sent (parse with scheduler.core.slo.parse_slo); {} = none
    prompt_tokens: int
    target_output_tokens: int  # the trace's true length: known to the client only
    scheduled_s: float  # when the workload says it arrives (a DAG stage: when its parents finished + think)
    send_s: float | None = None  # when it was sent; None = never sent (an earlier stage failed, or the run ended)
    token_s: list[float] = field(default_factory=list)  # arrival of every output token
    finish_s: float | None = None  # the final chunk; None = unfinished
    finish_reason: str | None = None  # server's "length" | "stop" | "abort" | ...; "client_stop" when we closed it
    program_id: str | None = None
    program_start_s: float | None = None  # the program's first send: compound deadlines count from here
    program_deadline_s: float | None = None  # whole-program deadline (relative to program_start_s)
    tier: str | None = None  # server's meta_info.slo.tier ("admitted" | "best_effort"), if it reports one
    server_ttft_ms: float | None = None  # server's meta_info.slo.ttft_ms (edge stamp to scheduler)
    error: str | None = None  # why it did not finish
    cut: bool = False  # the client gave up on it at the run's drain timeout (overload, not loss)

    @property
    def sent(self) -> bool:
        return self.send_s is not None

    @property
    def finished(self) -> bool:
        return self.finish_s is not None and self.finish_reason not in ("abort", None)

    @property
    def lost(self) -> bool:
        """Sent, not finished, not cut by the client: the server lost it (must never happen)."""
        return self.sent and self.finish_s is None and not self.cut

    @property
    def output_tokens(self) -> int:
        return len(self.token_s)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)
