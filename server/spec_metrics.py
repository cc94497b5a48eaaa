"""Prometheus gauges for SLO-adaptive speculation, rendered from the scheduler's latest status.

The length, α and the paper-optimal per-tier lengths change every batch in the scheduler
process; the HTTP process only sees the status snapshot, so these are rendered from it on each
scrape rather than kept as live metric objects.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


class _SnapshotCollector:
    def __init__(self, spec: Mapping[str, Any]) -> None:
        self.spec = spec

    def collect(self) -> Iterator[Metric]:
        spec = self.spec
        algorithm = str(spec.get("algorithm", ""))
        steps = GaugeMetricFamily(
            "sglang_slo_spec_steps", "Speculation length (drafted tokens per request) in force", labels=["algorithm"]
        )
        steps.add_metric([algorithm], float(spec.get("steps") or 0))
        yield steps
        if not spec.get("slo_adaptive"):
            return
        for name, key, text in (
            ("sglang_slo_spec_alpha", "alpha", "Per-token draft acceptance α (EMA over verifies)"),
            ("sglang_slo_spec_tokens_per_verify", "tokens_per_verify", "Acc(s): expected tokens per verify"),
            ("sglang_slo_spec_tightened_requests", "tightened_requests", "Requests behind their DSLO, tier tightened"),
        ):
            gauge = GaugeMetricFamily(name, text)
            gauge.add_metric([], float(spec.get(key) or 0.0))
            yield gauge
        for name, key, text in (
            ("sglang_slo_spec_switches", "switches", "Speculation length changes"),
            ("sglang_slo_spec_verifies", "verifies", "Verify passes observed"),
        ):
            counter = CounterMetricFamily(name, text)
            counter.add_metric([], float(spec.get(key) or 0))
            yield counter
        used = CounterMetricFamily("sglang_slo_spec_verifies_at_steps", "Verify passes by length", labels=["steps"])
        for length, count in (spec.get("steps_used") or {}).items():
            used.add_metric([str(length)], float(count))
        yield used
        tiers = GaugeMetricFamily(
            "sglang_slo_spec_tier_optimal_steps",
            "Per-tier speculation length SLOs-Serve's optimiser would pick (App. D), by TPOT tier",
            labels=["tpot_ms"],
        )
        for tpot, length in ((spec.get("per_tier_optimum") or {}).get("lengths") or {}).items():
            tiers.add_metric([str(tpot)], float(length))
        yield tiers


def speculation_exposition(engine_status: Mapping[str, Any]) -> bytes:
    """Prometheus text for the engine's `speculation` status block; empty without speculation."""
    spec = engine_status.get("speculation")
    if not spec:
        return b""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SnapshotCollector(spec))  # type: ignore[arg-type]
    return generate_latest(registry)
