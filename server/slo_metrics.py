"""SLO outcome counters for Prometheus and the attainment shown in /slo/status.

Kept in the project's own registry and appended to SGLang's /metrics text, so it works with
or without SGLang's --enable-metrics.
"""

from __future__ import annotations

import threading
from collections import defaultdict

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from scheduler.core.goodput import dslo_token_goodput
from scheduler.core.outcome import SloOutcome


class SloMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sglang_slo_requests",
            "Finished requests by SLO class and result (attained, missed, dropped)",
            ["slo_class", "result"],
            registry=self.registry,
        )
        self.output_tokens = Counter(
            "sglang_slo_output_tokens", "Output tokens by SLO class", ["slo_class"], registry=self.registry
        )
        self.goodput_tokens = Counter(
            "sglang_slo_goodput_tokens",
            "Output tokens delivered within their SLO (DSLO token goodput) by SLO class",
            ["slo_class"],
            registry=self.registry,
        )
        self.ttft = Histogram(
            "sglang_slo_ttft_seconds",
            "Time to first token by SLO class",
            ["slo_class"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = defaultdict(lambda: {"attained": 0, "missed": 0, "dropped": 0})

    def record(self, outcome: SloOutcome) -> None:
        cls = outcome.slo.slo_class.value
        result = "dropped" if not outcome.finished else ("attained" if outcome.attained else "missed")
        self.requests.labels(cls, result).inc()
        self.output_tokens.labels(cls).inc(outcome.output_tokens)
        self.goodput_tokens.labels(cls).inc(dslo_token_goodput([outcome], include_best_effort=True))
        if outcome.ttft_s is not None:
            self.ttft.labels(cls).observe(outcome.ttft_s)
        with self._lock:
            self._counts[cls][result] += 1

    def attainment(self) -> dict[str, dict[str, float | int]]:
        with self._lock:
            out: dict[str, dict[str, float | int]] = {}
            for cls, c in sorted(self._counts.items()):
                total = sum(c.values())
                out[cls] = {**c, "total": total, "attainment": c["attained"] / total if total else 0.0}
            return out

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
