"""Hand-built views for the routing-policy tests."""

from __future__ import annotations

from typing import Any

from router.routing_views import RouteRequest, WorkerView
from scheduler.core.slo import SloClass, SloSpec


def worker(wid: str, **kw: Any) -> WorkerView:
    kw.setdefault("gpu", "h100")
    kw.setdefault("kv_capacity_tokens", 100_000)
    kw.setdefault("max_running", 64)
    return WorkerView(worker_id=wid, **kw)


def request(rid: str = "r", prompt: int = 100, arrival: float = 0.0, **kw: Any) -> RouteRequest:
    kw.setdefault("slo", SloSpec())
    return RouteRequest(rid=rid, prompt_tokens=prompt, arrival_s=arrival, **kw)


def deadline_slo(ms: float) -> SloSpec:
    return SloSpec(deadline_ms=ms, slo_class=SloClass.DEADLINE)


def latency_slo(ttft_ms: float, tpot_ms: float | None = None) -> SloSpec:
    return SloSpec(ttft_ms=ttft_ms, tpot_ms=tpot_ms, slo_class=SloClass.LATENCY)
