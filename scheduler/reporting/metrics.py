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
        self.requests_by_tier = Counter(
            "sglang_slo_tier_requests",
            "Finished requests by admission tier (admitted, best_effort: declined by the policy) and result",
            ["tier", "result"],
            registry=self.registry,
        )
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = defaultdict(_zero_counts)
        self._tiers: dict[str, dict[str, int]] = defaultdict(_zero_counts)

    def record(self, outcome: SloOutcome, tier: str = "admitted") -> None:
        cls = outcome.slo.slo_class.value
        result = "dropped" if not outcome.finished else ("attained" if outcome.attained else "missed")
        self.requests.labels(cls, result).inc()
        self.requests_by_tier.labels(tier, result).inc()
        self.output_tokens.labels(cls).inc(outcome.output_tokens)
        self.goodput_tokens.labels(cls).inc(dslo_token_goodput([outcome], include_best_effort=True))
        if outcome.ttft_s is not None:
            self.ttft.labels(cls).observe(outcome.ttft_s)
        with self._lock:
            self._counts[cls][result] += 1
            self._tiers[tier][result] += 1

    def attainment(self) -> dict[str, dict[str, float | int]]:
        """Per SLO class."""
        with self._lock:
            return _summaries(self._counts)

    def tiers(self) -> dict[str, dict[str, float | int]]:
        """Per admission tier: whether admission control keeps its promise to the admitted."""
        with self._lock:
            return _summaries(self._tiers)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _zero_counts() -> dict[str, int]:
    return {"attained": 0, "missed": 0, "dropped": 0}


def _summaries(counts: dict[str, dict[str, int]]) -> dict[str, dict[str, float | int]]:
    out: dict[str, dict[str, float | int]] = {}
    for key, c in sorted(counts.items()):
        total = sum(c.values())
        out[key] = {**c, "total": total, "attainment": c["attained"] / total if total else 0.0}
    return out
