"""Prometheus series for the engine's own state, rendered from the scheduler's latest status on
each scrape (the scheduler runs in another process; the HTTP process holds its snapshot).

Queue, KV cache, the policy's drops, deferrals and preemptions, the perf model's predicted decode
step, and, on an emulated card, its late steps: a figure measured while the host let the card run
late is not the card's (the validity rule of every benchmark on emulated workers).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

PREFIX = "sglang_slo_engine_"
# A status key and its series' help; the series is PREFIX + the key.
GAUGES = {
    "waiting": "Requests waiting in the scheduler's queue",
    "running": "Requests in the running batch",
    "kv_used_tokens": "KV-cache tokens held by requests",
    "kv_capacity_tokens": "KV-cache capacity in tokens",
    "best_effort_waiting": "Waiting requests the policy put in the best-effort tier",
    "held_waiting": "Best-effort-tier requests past due, held while SLO work runs",
}
COUNTERS = {
    "steps": "Scheduling passes",
    "dropped_in_queue": "Requests dropped while queued (503), by the policy or max_queue_ms",
    "prefill_deferred": "Passes the plan turned into decode passes (no prefill fitted)",
    "prefill_alone": "Passes whose prefill ran without the decodes (their slack allowed it)",
    "preempted": "Running requests the policy preempted",
    "lost_held_passes": "Passes that held past-due best-effort requests",
    "plan_errors": "Passes whose plan failed (SGLang's own choice kept)",
    "budget_fallbacks": "Passes whose policy search ran out of its per-pass budget (its fallback plan applied)",
}


class _EngineCollector:
    def __init__(self, engine: Mapping[str, Any]) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        engine = self.engine
        for key, text in GAUGES.items():
            if isinstance(engine.get(key), int | float):
                yield GaugeMetricFamily(PREFIX + key, text, value=float(engine[key]))
        for key, text in COUNTERS.items():
            if isinstance(engine.get(key), int | float):
                yield CounterMetricFamily(PREFIX + key, text, value=float(engine[key]))
        perf = engine.get("perf_model") or {}
        if perf:
            yield GaugeMetricFamily(
                "sglang_slo_engine_perf_model_ready",
                "1 once the perf model is trusted",
                value=float(bool(perf.get("ready"))),
            )
            decode = GaugeMetricFamily(
                "sglang_slo_engine_predicted_decode_seconds",
                "The perf model's decode step (128 KV tokens per request), by batch size",
                labels=["batch"],
            )
            for batch, ms in (perf.get("predicted_decode_ms") or {}).items():
                decode.add_metric([str(batch)], float(ms) / 1000.0)
            yield decode
        emulation = engine.get("emulation") or {}
        if emulation:
            yield CounterMetricFamily(
                "sglang_slo_engine_emulated_steps",
                "Steps paced to the emulated card",
                value=float(emulation.get("steps") or 0),
            )
            yield CounterMetricFamily(
                "sglang_slo_engine_late_steps",
                "Emulated steps whose host work overran the card's time (the emulation's distortion)",
                value=float(emulation.get("late_steps") or 0),
            )


def engine_exposition(engine_status: Mapping[str, Any]) -> bytes:
    """Prometheus text for the engine status; empty before the scheduler's first snapshot."""
    if not engine_status:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_EngineCollector(engine_status))  # type: ignore[arg-type]
    return generate_latest(registry)
