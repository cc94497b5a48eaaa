"""Router-side SLO reports and the router's Prometheus metrics.

A request may run on several workers (failover, migration), so no worker can score it: each
worker sees only its part and its own arrival. The router scores every request from the times
its tokens reached the router, against the client's arrival at the router, with the same
`evaluate` (and the same compound-program deadlines) the single server uses, so "attained" means
the same thing behind a router as in front of one worker.

Metrics: SloMetrics' families (outcomes by SLO class and admission tier) fed by those reports, plus a
collector that reads the dispatcher's counters and the workers' last load reports at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from router.dispatcher import STATUS_EVENTS
from router.routing_views import WorkerView
from scheduler.core.slo import SloSpec
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportKeeper

ADMITTED, BEST_EFFORT = "admitted", "best_effort"


class RouterReports(SloReportKeeper):
    """Scores finished requests and keeps the recent reports (by rid) and the outcome counters."""

    def __init__(self, metrics: SloMetrics | None = None, keep_reports: int = 10_000) -> None:
        super().__init__(metrics if metrics is not None else SloMetrics(), keep_reports)

    def finish(
        self,
        rid: str,
        slo: SloSpec,
        arrival_unix: float,
        token_times: Sequence[float],
        finished: bool,
        tier: str | None = None,
        now: float | None = None,
    ) -> dict[str, Any]:
        """Score the request once (finished=False: error, abort or client gone) and count it."""
        tier = tier if tier in (ADMITTED, BEST_EFFORT) else ADMITTED
        return self.score(rid, slo, arrival_unix, token_times, finished, tier, now=now)

    def attainment(self) -> dict[str, dict[str, float | int]]:
        return self.metrics.attainment()

    def tiers(self) -> dict[str, dict[str, float | int]]:
        return self.metrics.tiers()


WORKER_GAUGES: tuple[tuple[str, str, Callable[[WorkerView], float]], ...] = (
    ("healthy", "1 while the worker is alive", lambda w: float(w.healthy)),
    ("inflight", "Requests the router has in flight on the worker", lambda w: float(w.inflight)),
    ("queue_len", "Waiting requests (last load report)", lambda w: float(w.queue_len)),
    ("running", "Running requests (last load report)", lambda w: float(w.running)),
    ("kv_used_tokens", "KV-cache tokens in use (last load report)", lambda w: float(w.kv_used_tokens)),
    ("kv_capacity_tokens", "KV-cache capacity in tokens", lambda w: float(w.kv_capacity_tokens)),
    ("queue_delay_seconds", "EMA of the worker's queueing delay", lambda w: w.queue_delay_s),
    ("prefill_seconds_per_token", "EMA of prefill time per prompt token", lambda w: w.prefill_s_per_token),
    ("decode_seconds_per_token", "EMA of decode time per output token", lambda w: w.decode_s_per_token),
    ("iteration_seconds", "EMA of one engine iteration", lambda w: w.iteration_s),
    ("tokens_per_minute", "Prompt + output tokens served over the last minute", lambda w: w.tokens_per_minute),
)


TIER_GAUGES = (
    ("instances", "Workers serving the TPOT tier"),
    ("pending_instances", "Workers assigned the tier that serve none of its requests yet"),
    ("pending", "Requests of the tier served best effort: it wants another instance"),
)
TIER_COUNTERS = ("routed", "promoted", "scaled_up", "best_effort", "released")


MAX_TIER_LABELS = 64  # tier_ms label values per family; the rest are summed under OTHER_TIERS
OTHER_TIERS = "other"


def _bounded_tiers(tiers: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    """At most MAX_TIER_LABELS TPOT tiers, the rest summed into one: a policy that makes a tier of every
    distinct client TPOT must not give Prometheus a series per client-chosen number."""
    names = sorted(tiers)
    kept = {t: {k: float(v or 0) for k, v in tiers[t].items() if isinstance(v, (int, float))} for t in names}
    if len(names) <= MAX_TIER_LABELS:
        return kept
    out = {t: kept[t] for t in names[: MAX_TIER_LABELS - 1]}
    other: dict[str, float] = {}
    for t in names[MAX_TIER_LABELS - 1 :]:
        for k, v in kept[t].items():
            other[k] = other.get(k, 0.0) + v
    out[OTHER_TIERS] = other
    return out


def tier_metrics(policy_status: dict[str, Any] | None) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """PolyServe's per-TPOT-tier autoscaling signals (a policy status with `tiers`), labelled by TPOT ms."""
    tiers = (policy_status or {}).get("tiers")
    if not isinstance(tiers, dict):
        return
    tiers = _bounded_tiers(tiers)
    for name, doc in TIER_GAUGES:
        family = GaugeMetricFamily(f"sglang_slo_router_tier_{name}", doc, labels=["tier_ms"])
        for tier, signals in sorted(tiers.items()):
            family.add_metric([tier], float(signals.get(name, 0)))
        yield family
    events = CounterMetricFamily(
        "sglang_slo_router_tier_events", "Per-tier placement events", labels=["tier_ms", "event"]
    )
    for tier, signals in sorted(tiers.items()):
        for name in TIER_COUNTERS:
            events.add_metric([tier, name], float(signals.get(name, 0)))
    yield events


PD_TIER_GAUGES = (
    ("rate_rps", "rate_rps", "Arrival rate of the TPOT tier over the sizing window (req/s)"),
    ("mean_input_tokens", "mean_input", "Mean prompt tokens of the tier's arrivals in the window"),
    ("mean_output_tokens", "mean_output", "Mean output tokens of the tier's completions in the window"),
    ("feasible", "feasible", "1 when the tier's TPOT exceeds one decode step (C), else 0"),
    ("prefill_instances", "prefill_instances", "Prefill devices the tier's load needs (fractional)"),
    ("decode_instances", "decode_instances", "Decode devices the tier's load needs (fractional)"),
)
PD_GAUGES = (
    ("ratio", "ratio", "Optimal prefill:decode device ratio for the live mix (SLOs-Serve App. A)"),
    ("prefill_instances", "prefill_instances", "Prefill devices the live load needs (fractional)"),
    ("decode_instances", "decode_instances", "Decode devices the live load needs (fractional)"),
    ("goodput_per_device_rps", "goodput_per_device_rps", "Goodput bound g* per device, optimal split (Eq. 4)"),
    ("overhead_seconds", "overhead_s", "C: step time of a one-request decode batch"),
    ("decode_tokens_per_second", "max_token_tpt", "MaxTokenTpt: 1 / marginal decode cost per token"),
    ("prefill_tokens_per_second", "prefill_tpt", "Prompt tokens per second of a prefill device"),
)


def pd_sizing_metrics(sizing: dict[str, Any] | None) -> Iterator[GaugeMetricFamily]:
    """router.pd_sizing's dict as gauges (`sglang_slo_router_pd_*`); a value that is None (no
    decode demand yet, no completions) is left out rather than exported as 0."""
    if not isinstance(sizing, dict):
        return
    for name, key, doc in PD_GAUGES:
        value = sizing.get(key)
        if value is not None:
            yield GaugeMetricFamily(f"sglang_slo_router_pd_{name}", doc, value=float(value))
    tiers = sizing.get("tiers")
    if not isinstance(tiers, dict):
        return
    for name, key, doc in PD_TIER_GAUGES:
        family = GaugeMetricFamily(f"sglang_slo_router_pd_tier_{name}", doc, labels=["tier_ms"])
        for tier, entry in sorted(tiers.items()):
            value = entry.get(key)
            if value is not None:
                family.add_metric([tier], float(value))
        yield family


class RouterCollector(Collector):
    """Reads the router's live state at scrape time; nothing is double-booked in counters."""

    def __init__(
        self,
        status: Callable[[], dict[str, Any]],
        views: Callable[[], list[WorkerView]],
        policy_status: Callable[[], dict[str, Any] | None] | None = None,
        pd_sizing: Callable[[], dict[str, Any] | None] | None = None,
    ) -> None:
        self._status = status
        self._views = views
        self._policy_status = policy_status or (lambda: None)
        self._pd_sizing = pd_sizing or (lambda: None)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        status = self._status()
        events = CounterMetricFamily("sglang_slo_router_events", "Router request events", labels=["event"])
        for name in STATUS_EVENTS:
            events.add_metric([name], float(status.get(name, 0)))
        yield events
        routed = CounterMetricFamily(
            "sglang_slo_router_routed", "Placements per worker (resumes included)", labels=["worker"]
        )
        for worker, count in sorted(status.get("routed", {}).items()):
            routed.add_metric([worker], float(count))
        yield routed
        yield GaugeMetricFamily("sglang_slo_router_inflight", "Requests in flight", value=status.get("inflight", 0))
        yield GaugeMetricFamily(
            "sglang_slo_router_waiting_for_worker",
            "Requests that lost their worker and wait for another",
            value=status.get("waiting_for_worker", 0),
        )
        decisions = status.get("decision_ns", {})
        yield CounterMetricFamily(
            "sglang_slo_router_decisions", "Routing decisions made", value=float(decisions.get("count", 0))
        )
        latency = GaugeMetricFamily(
            "sglang_slo_router_decision_seconds",
            "Routing decision latency over the recent window",
            labels=["quantile"],
        )
        for key, label in (("p50", "0.5"), ("p99", "0.99"), ("max", "1")):
            if decisions.get(key) is not None:
                latency.add_metric([label], decisions[key] / 1e9)
        yield latency
        yield from tier_metrics(self._policy_status())
        yield from pd_sizing_metrics(self._pd_sizing())
        views = self._views()
        yield GaugeMetricFamily("sglang_slo_router_workers", "Registered workers", value=len(views))
        for name, doc, read in WORKER_GAUGES:
            family = GaugeMetricFamily(f"sglang_slo_router_worker_{name}", doc, labels=["worker", "gpu"])
            for w in views:
                family.add_metric([w.worker_id, w.gpu], read(w))
            yield family
