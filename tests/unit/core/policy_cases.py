"""Shared builders for policy tests: hypothesis strategies for engine views, the JITServe
App. D.1 constructions and a saturating stream run on the virtual-time simulator, and the
properties every preempting policy must keep."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from hypothesis import strategies as st

from scheduler.core.perf_model import RooflinePerfModel, constant_model, linear_model
from scheduler.core.sim import EngineConfig, SimRequest, SimResult, Simulator
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, Policy, RequestView, StepPlan

TAU = 1.0 / 64  # one iteration; a power of two keeps virtual times exact


def small_gpu(base_s: float = 0.008) -> RooflinePerfModel:
    """An affine step time for a small model on one GPU (8 ms per pass, 150 µs per decode)."""
    return linear_model(base_s=base_s, per_token_s=6e-5, per_seq_s=9e-5, per_kv_token_s=2e-8)


def policy_view(
    waiting: Sequence[RequestView],
    running: Sequence[RequestView] = (),
    cap: int = 4,
    step: int = 0,
    now: float = 0.0,
    chunk: int = 512,
    free_kv: int = 10**6,
    total_kv: int = 2 * 10**6,
) -> EngineView:
    """A view with `cap` slots and, by default, room to spare (512-token chunks, a million free
    KV tokens)."""
    return EngineView(
        now=now,
        waiting=list(waiting),
        running=list(running),
        max_running_requests=cap,
        chunk_size=chunk,
        free_kv_tokens=free_kv,
        total_kv_tokens=total_kv,
        step=step,
    )


class RecordingPolicy:
    """Plans nothing and keeps every view it is shown: what a wrapper or an engine hands a policy."""

    name = "recorder"
    slo_levers = False

    def __init__(self) -> None:
        self.views: list[EngineView] = []

    def plan(self, view: EngineView) -> StepPlan:
        self.views.append(view)
        return StepPlan()


def latency_burst(ttfts_ms: tuple[float, float, float]) -> EngineView:
    """Three 1 000-token prompts just in, A, B and C, with these TTFTs and answers of 8, 16 and
    32 tokens (so value per second and time budgets rank them A, B, C). On `small_gpu` each
    prefills in 76 ms at full speed: alone, each makes a TTFT above that."""

    def latency(ttft_ms: float) -> SloSpec:
        return SloSpec(ttft_ms=ttft_ms, tpot_ms=1_000, slo_class=SloClass.LATENCY)

    reqs = [
        RequestView(rid=rid, slo=latency(ttft), arrival=0.0, prompt_len=1_000, predicted_output_len=out)
        for rid, ttft, out in zip("ABC", ttfts_ms, (8, 16, 32), strict=True)
    ]
    return policy_view(reqs, cap=8, step=1)


def deadline_request(
    rid: str,
    deadline_ms: float = 60_000,
    prompt: int = 10,
    out: float | None = 100,
    arrival: float = 0.0,
    weight: float = 1.0,
    **kw: Any,
) -> RequestView:
    """A deadline-class request view; `kw` sets any other RequestView field."""
    slo = SloSpec(deadline_ms=deadline_ms, slo_class=SloClass.DEADLINE, weight=weight)
    return RequestView(rid=rid, slo=slo, arrival=arrival, prompt_len=prompt, predicted_output_len=out, **kw)


def stage_behind_its_sub_deadline(arrival: float = 0.0) -> RequestView:
    """A compound stage whose sub-deadline (50 ms after `arrival`) is out of reach while its
    program's 60 s deadline is not."""
    slo = SloSpec(deadline_ms=60_000, slo_class=SloClass.COMPOUND, program_id="p", stage=1)
    return RequestView(
        rid="stage",
        slo=slo,
        arrival=arrival,
        prompt_len=10,
        predicted_output_len=100,
        program_arrival=arrival,
        stage_deadline=arrival + 0.05,
    )


@st.composite
def slo_specs(draw: st.DrawFn) -> SloSpec:
    kind = draw(st.sampled_from(list(SloClass)))
    weight = draw(st.floats(0.1, 10.0))
    max_queue = draw(st.one_of(st.none(), st.floats(1.0, 5000.0)))
    if kind is SloClass.LATENCY:
        ttft = draw(st.floats(10.0, 5000.0))
        tpot = draw(st.one_of(st.none(), st.floats(5.0, 200.0)))
        return SloSpec(ttft_ms=ttft, tpot_ms=tpot, slo_class=kind, weight=weight, max_queue_ms=max_queue)
    if kind is SloClass.DEADLINE:
        return SloSpec(deadline_ms=draw(st.floats(10.0, 60000.0)), slo_class=kind, weight=weight)
    if kind is SloClass.COMPOUND:
        return SloSpec(
            deadline_ms=draw(st.floats(10.0, 60000.0)),
            slo_class=kind,
            program_id=draw(st.sampled_from(["p1", "p2", "p3"])),
            stage=draw(st.integers(0, 2)),
            weight=weight,
        )
    return SloSpec(weight=weight, max_queue_ms=max_queue)


@st.composite
def request_views(draw: st.DrawFn, rid: str, now: float, running: bool) -> RequestView:
    slo = draw(slo_specs())
    arrival = now - draw(st.floats(0.0, 30.0))
    generated = draw(st.integers(1 if running else 0, 300)) if running or draw(st.booleans()) else 0
    started = generated > 0
    return RequestView(
        rid=rid,
        slo=slo,
        arrival=arrival,
        prompt_len=draw(st.integers(1, 4000)),
        generated=generated,
        max_new_tokens=draw(st.one_of(st.none(), st.integers(1, 2000))),
        predicted_output_len=draw(st.one_of(st.none(), st.floats(1.0, 2000.0))),
        first_token_time=arrival + 0.01 if started else None,
        prefix_cached=0,
        program_arrival=arrival - 1.0 if slo.slo_class is SloClass.COMPOUND else None,
        attained_service=draw(st.floats(0.0, 1e5)),
    )


@st.composite
def engine_views(draw: st.DrawFn, max_waiting: int = 12, max_running: int = 8) -> EngineView:
    now = 100.0
    n_w = draw(st.integers(0, max_waiting))
    cap = draw(st.integers(1, max_running))
    n_r = draw(st.integers(0, cap))
    waiting = [draw(request_views(f"w{i}", now, False)) for i in range(n_w)]
    running = [draw(request_views(f"r{i}", now, True)) for i in range(n_r)]
    return EngineView(
        now=now,
        waiting=waiting,
        running=running,
        max_running_requests=cap,
        chunk_size=draw(st.sampled_from([1, 64, 512, 8192])),
        free_kv_tokens=100_000,
        total_kv_tokens=200_000,
        step=draw(st.integers(0, 400)),
    )


@st.composite
def waiting_picks(draw: st.DrawFn) -> tuple[EngineView, RequestView]:
    """An engine view with at least one waiting request, and one of them."""
    view = draw(engine_views().filter(lambda v: bool(v.waiting)))
    return view, draw(st.sampled_from(view.waiting))


def with_weight(view: EngineView, rid: str, factor: float) -> EngineView:
    def bump(r: RequestView) -> RequestView:
        return replace(r, slo=replace(r.slo, weight=r.slo.weight * factor)) if r.rid == rid else r

    return replace(view, waiting=[bump(r) for r in view.waiting], running=[bump(r) for r in view.running])


def preempts_only_every(policy: Policy, view: EngineView, period: int) -> bool:
    """False when the policy preempts on a step that is not a multiple of `period` (its frame
    or quantum)."""
    plan = policy.plan(view)
    return view.step % period == 0 or plan.preempt == []


# -- JITServe App. D.1 -----------------------------------------------------------------------


def d1_instance(n: int, a_weight: float, b_slack: float = 1.5) -> list[SimRequest]:
    """One valuable request A (compute T = (N+1)·τ, deadline T) and N unit requests B_i arriving
    every τ, each needing τ with a deadline b_slack·τ after it arrives (shorter and more urgent
    than A). With b_weight = 0.5 and one-token prompts, R(B_i) = 1 and R(A) = a_weight·(N+2)."""
    t = (n + 1) * TAU
    a = SimRequest(
        "A", SloSpec(deadline_ms=t * 1000, slo_class=SloClass.DEADLINE, weight=a_weight), 0.0, 1, n + 1, n + 1, n + 1
    )
    bs = [
        SimRequest(
            f"B{i}",
            SloSpec(deadline_ms=b_slack * TAU * 1000, slo_class=SloClass.DEADLINE, weight=0.5),
            i * TAU,
            1,
            1,
            1,
            1,
        )
        for i in range(n)
    ]
    return [a, *bs]


def run_single_slot(policy: Policy, requests: list[SimRequest], **cfg: int) -> SimResult:
    config = EngineConfig(max_running_requests=cfg.get("batch", 1), chunk_size=cfg.get("chunk", 64))
    return Simulator(policy, constant_model(TAU), config).run(requests, max_steps=cfg.get("max_steps", 100_000))


def weighted_goodput(result: SimResult) -> float:
    """JITServe deadline goodput (input + output tokens if on time) times the request weight."""
    outs = result.outcomes()
    return sum(
        rec.req.slo.weight * (rec.req.prompt_len + rec.req.output_len)
        for rid, rec in result.records.items()
        if outs[rid].attained
    )


def d1_run(policy: Policy, n: int, b_slack: float = 1.5) -> tuple[float, bool]:
    """App. D.1 with A worth 10·N: the weighted goodput and whether A was served. Serving A earns
    M = R(A) = 10·N·(N+2); serving every B_i instead earns only N."""
    res = run_single_slot(policy, d1_instance(n, 10.0 * n, b_slack))
    return weighted_goodput(res), res.outcomes()["A"].attained


def best_effort_finishes(policy: Policy, steps: int = 400, deadline_weight: float = 1.0) -> bool:
    """Whether one best-effort request finishes among deadline requests (of `deadline_weight`)
    arriving every τ, faster than the two slots can serve them: starvation unless the policy
    ages or reserves."""
    slo = SloSpec(deadline_ms=60_000, slo_class=SloClass.DEADLINE, weight=deadline_weight)
    reqs = [SimRequest(f"s{i}", slo, i * TAU, 8, 4, 4, 4) for i in range(steps)]
    reqs.append(SimRequest("be", SloSpec(), 0.5 * TAU, 8, 4, 4, 4))
    sim = Simulator(policy, constant_model(TAU), EngineConfig(max_running_requests=2, chunk_size=64))
    return sim.run(reqs, max_steps=steps).records["be"].finished
