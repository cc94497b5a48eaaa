"""deploy/monitoring: every series the Grafana dashboard queries is one the server or the router
exports (read from their real exporters), under the component the query selects; the Prometheus
scrape configuration keeps the pods of deploy/kubernetes and labels them as the dashboard expects."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = ROOT / "deploy" / "monitoring" / "grafana-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "monitoring" / "prometheus.yml"
SERIES_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("", "_sum", "_count", "_created"),
    "gauge": ("",),
}


def _series(text: bytes) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text.decode()):
        names |= {family.name + suffix for suffix in SERIES_SUFFIXES.get(family.type, ("",))}
    return names


def _engine_status() -> dict[str, Any]:
    """A full scheduler status, as the scheduler publishes it (its dataclass is the contract)."""
    from scheduler.components.status import SchedulerStatus

    return SchedulerStatus(
        policy="slos", waiting=1, running=2, max_running_requests=8, disaggregation_mode="null",
        chunked_prefill_size=512, steps=10, kv_capacity_tokens=1000, kv_used_tokens=10,
        prefill_ms_per_token=0.1, dropped_in_queue=1, prefill_deferred=1, prefill_alone=2, batch_cap=4,
        prefill_tokens=256,
        startup_chunk_size=512, chunk_budget=512, dynamic_chunking=None, decode_cap=None, mixed_batching=True,
        best_effort_waiting=0, held_waiting=0, lost_held_passes=0,
        perf_model={"ready": True, "predicted_decode_ms": {"1": 7.0, "8": 9.0}}, predictor_accuracy=None,
        compound={}, plan_errors=0, preempted=1,
        emulation={"steps": 100, "late_steps": 1, "late_share": 0.01}, speculation=None, length_predictor=None,
    ).to_dict()  # fmt: skip


def worker_series() -> set[str]:
    from scheduler.reporting.metrics import SloMetrics
    from server.engine_metrics import engine_exposition
    from server.spec_metrics import speculation_exposition

    engine = _engine_status()
    spec = {
        "algorithm": "EAGLE",
        "slo_adaptive": True,
        "steps": 2,
        "steps_used": {"2": 1},
        "per_tier_optimum": {"lengths": {"50": 2}},
    }
    return _series(
        SloMetrics().exposition() + engine_exposition(engine) + speculation_exposition({"speculation": spec})
    )


def router_series() -> set[str]:
    from router.monitoring import RouterCollector, RouterReports
    from router.routing_views import WorkerView

    reports = RouterReports()
    view = WorkerView(worker_id="w0", gpu="h100", kv_capacity_tokens=1000, max_running=8)
    status = {"routed": {"w0": 1}, "decision_ns": {"count": 1, "p50": 1, "p99": 2, "max": 3}}
    tiers = {"tiers": {"50": {"instances": 1}}}
    reports.metrics.registry.register(RouterCollector(lambda: status, lambda: [view], lambda: tiers))
    return _series(reports.metrics.exposition())


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]


def test_every_queried_series_is_exported_by_the_component_it_selects() -> None:
    exported = {"worker": worker_series(), "router": router_series()}
    assert "sglang_slo_engine_late_steps_total" in exported["worker"]  # the exporters were really read
    checked = 0
    for title, expr in queries():
        names = set(re.findall(r"\bsglang_[a-z0-9_]+\b", expr))
        assert names, f"{title}: {expr} queries none of our series"
        selected = set(re.findall(r'component="(\w+)"', expr))
        if "$component" in expr:
            selected |= {"router", "worker"}  # the dashboard's variable offers both
        assert selected, f"{title}: {expr} selects no component"
        for component in selected:
            missing = names - exported[component]
            assert not missing, f"{title}: the {component} exports none of {sorted(missing)}"
            checked += 1
    assert checked >= 14


def test_the_dashboards_component_variable_offers_what_prometheus_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = [v for v in dashboard["templating"]["list"] if v["name"] == "component"]
    assert set(variable["query"].split(",")) == {"router", "worker"}


def _relabel(rules: list[dict[str, Any]], meta: dict[str, str]) -> dict[str, str] | None:
    """Prometheus' keep/replace relabelling over a target's meta labels (None: dropped)."""
    labels = dict(meta)
    for rule in rules:
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule["source_labels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        action = rule.get("action", "replace")
        if action == "keep":
            if not match:
                return None
        elif action == "replace" and match:
            replacement = rule.get("replacement", "$1")
            labels[rule["target_label"]] = match.expand(re.sub(r"\$(\d+)", r"\\\1", replacement))
    return labels


def _sanitize(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def test_prometheus_keeps_the_kubernetes_pods_and_labels_their_component() -> None:
    """Each pod of the manifests is kept by exactly one job, the one for its component."""
    from tests.unit.deploy.test_kubernetes import documents

    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = [j for j in config["scrape_configs"] if "kubernetes_sd_configs" in j]
    components = set()
    for _, doc in documents():
        if doc["kind"] != "Deployment":
            continue
        template = doc["spec"]["template"]
        meta = {"__address__": "10.1.2.3:9999"}
        meta |= {f"__meta_kubernetes_pod_label_{_sanitize(k)}": v for k, v in template["metadata"]["labels"].items()}
        meta |= {
            f"__meta_kubernetes_pod_annotation_{_sanitize(k)}": v
            for k, v in template["metadata"]["annotations"].items()
        }
        kept = [(job["job_name"], labels) for job in jobs if (labels := _relabel(job["relabel_configs"], meta))]
        assert len(kept) == 1, (doc["metadata"]["name"], [name for name, _ in kept])
        ((job_name, labels),) = kept
        port = template["metadata"]["annotations"]["prometheus.io/port"]
        assert labels["__address__"] == f"10.1.2.3:{port}" and labels["__metrics_path__"] == "/metrics"
        assert job_name.endswith(labels["component"]) or job_name.endswith(labels["component"] + "s")
        components.add(labels["component"])
    assert components == {"router", "worker"}
    static = [j for j in config["scrape_configs"] if "static_configs" in j]
    assert {c["labels"]["component"] for j in static for c in j["static_configs"]} == {"router", "worker"}


def test_every_scrape_sends_a_key_read_from_a_file() -> None:
    """/metrics needs a metrics or admin key; a key written into this file would be readable by
    whoever reads the configuration."""
    config = yaml.safe_load(PROMETHEUS.read_text())
    for job in config["scrape_configs"]:
        auth = job.get("authorization")
        assert auth is not None, job["job_name"]
        assert auth.get("type", "Bearer") == "Bearer" and "credentials" not in auth, job["job_name"]
        assert auth["credentials_file"].startswith("/"), job["job_name"]
