"""Worker messages as the routing policies see them: a registration and the latest load report
become one `WorkerView` (the wire carries measurements; the view adds the router's own counts)."""

from __future__ import annotations

from dataclasses import replace

from router.protocol import LoadReport, ProtocolError, Register
from router.routing_views import WorkerView


def register_to_view(
    reg: Register, now: float, tier: float | None = None, *, healthy: bool = True, inflight: int = 0
) -> WorkerView:
    """A worker that has not reported yet: its capacity, no measured load."""
    return WorkerView(
        worker_id=reg.worker_id,
        gpu=reg.gpu,
        kv_capacity_tokens=reg.kv_capacity_tokens,
        max_running=reg.max_running,
        inflight=inflight,
        tpot_tier_ms=tier,
        role=reg.role,
        healthy=healthy,
        last_report_s=now,
        slo_levers=reg.slo_levers,
    )


def load_report_to_view(
    report: LoadReport,
    inflight: int,
    now: float,
    tier: float | None = None,
    *,
    registration: Register,
    healthy: bool = True,
) -> WorkerView:
    """The report's measurements over the registration's capacity (the report omits static facts)."""
    if report.worker_id != registration.worker_id:
        raise ProtocolError(
            "worker_id", f"report from {report.worker_id!r}, registration of {registration.worker_id!r}"
        )
    static = register_to_view(registration, now, tier, healthy=healthy, inflight=inflight)
    return replace(
        static,
        queue_len=report.queue_len,
        running=report.running,
        kv_used_tokens=report.kv_used_tokens,
        queue_delay_s=report.queue_delay_s,
        prefill_s_per_token=report.prefill_s_per_token,
        decode_s_per_token=report.decode_s_per_token,
        iteration_s=report.iteration_s,
        tokens_per_minute=report.tokens_per_minute,
        queue_drain_s=report.queue_drain_s,
        decode_step_s=report.decode_step_s or 0.0,
    )
