"""Seeded engine views with every awkward case a pass can hold, for holding the vectorised plan
path equal to per-request references: all SLO classes (compound programs with and without
program arrival and stage deadline), shared and own specs, best effort, `on_infeasible:
reject`, max_queue_ms, declined (best_effort_tier) requests, retracted and prefilling requests,
requests long past due, ties in arrival, true lengths for the oracle variants, and passes over
the same request objects whose per-pass fields change between passes, as the adapter's and the
simulator's views do."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import replace

from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView

SHAPES = ((0, 0), (0, 5), (3, 0), (5, 3), (40, 20), (300, 64))  # (waiting, running)
NOW = 1000.0


def _spec(rng: random.Random, shared: list[SloSpec]) -> SloSpec:
    if shared and rng.random() < 0.5:
        return rng.choice(shared)
    kind = rng.random()
    queue_ms = rng.choice([None, None, None, 50.0, 400.0, 2000.0])
    on_infeasible = rng.choice(["best_effort", "best_effort", "reject"])
    weight = rng.choice([1.0, 1.0, 2.0, 0.5])
    common = {"max_queue_ms": queue_ms, "weight": weight}
    if kind < 0.35:
        spec = SloSpec(
            ttft_ms=rng.choice([100.0, 200.0, 500.0, 3000.0]),
            tpot_ms=rng.choice([None, 20.0, 50.0, 100.0]),
            slo_class=SloClass.LATENCY,
            on_infeasible=on_infeasible,
            **common,
        )
    elif kind < 0.55:
        spec = SloSpec(
            deadline_ms=rng.choice([300.0, 2e3, 10e3, 60e3]),
            ttft_ms=rng.choice([None, None, 200.0]),
            slo_class=SloClass.DEADLINE,
            on_infeasible=on_infeasible,
            **common,
        )
    elif kind < 0.7:
        spec = SloSpec(
            deadline_ms=rng.choice([5e3, 30e3]),
            slo_class=SloClass.COMPOUND,
            program_id=f"p{rng.randrange(7)}",
            stage=rng.choice([0, 1, 2, "x"]),
            on_infeasible=on_infeasible,
            **common,
        )
    else:
        spec = SloSpec(**common)
    shared.append(spec)
    return spec


def _request(rng: random.Random, rid: str, now: float, running: bool, shared: list[SloSpec]) -> RequestView:
    slo = _spec(rng, shared)
    if rng.random() < 0.05:
        arrival = now - 1.0  # ties
    else:
        arrival = now - rng.choice([rng.uniform(0, 0.3), rng.uniform(0, 3.0), rng.uniform(0, 60.0)])
    prompt = int(min(16_000, rng.lognormvariate(6.0, 1.2))) + 1
    started = rng.random() < (0.9 if running else 0.1)  # a started waiting request was retracted
    generated = rng.randrange(1, 400) if started else (0 if rng.random() < 0.9 else rng.randrange(0, 5))
    if running and started and slo.ttft_ms is not None and rng.random() < 0.3:
        # on its deadline-based schedule, the next token due within 30 ms: it constrains the step
        arrival = now - (slo.ttft_ms + generated * (slo.tpot_ms or 0.0)) / 1000.0 + rng.uniform(0.001, 0.03)
    compound = slo.slo_class is SloClass.COMPOUND
    return RequestView(
        rid=rid,
        slo=slo,
        arrival=arrival,
        prompt_len=prompt,
        generated=generated,
        max_new_tokens=rng.choice([None, 16, 256, 1024]),
        predicted_output_len=rng.choice([None, rng.uniform(1, 2000)]),
        first_token_time=arrival + rng.uniform(0.01, 1.0) if started else None,
        prefix_cached=rng.choice([0, 0, prompt // 2, prompt]),
        program_arrival=arrival - rng.uniform(0, 5) if compound and rng.random() < 0.8 else None,
        stage_deadline=now + rng.uniform(-2, 10) if compound and rng.random() < 0.4 else None,
        attained_service=rng.uniform(0, 3000),
        best_effort_tier=rng.random() < 0.15,
        oracle_output_len=rng.randrange(1, 3000) if rng.random() < 0.3 else None,  # for *_oracle policies
    )


def view_passes(seed: int, n_waiting: int, n_running: int, passes: int = 3) -> Iterator[EngineView]:
    """`passes` views over the same request objects: between two passes time moves on, running
    requests gain tokens, some waiting ones change prefix, tier or prediction, one may start and
    one be retracted, and new requests arrive. A view's requests change once the next view is
    asked for: plan each view before taking the next."""
    rng = random.Random(seed)
    now = NOW + rng.uniform(0, 1)
    shared: list[SloSpec] = []
    waiting = [_request(rng, f"w{i}", now, False, shared) for i in range(n_waiting)]
    running = [_request(rng, f"r{i}", now, True, shared) for i in range(n_running)]
    fresh = n_waiting + n_running
    for p in range(passes):
        yield EngineView(
            now=now,
            waiting=list(waiting),
            running=list(running),
            max_running_requests=rng.choice([8, 256, max(1, n_running)]),
            chunk_size=rng.choice([0, 256, 8192]) if p else 8192,
            free_kv_tokens=rng.choice([0, 600_000]),
            total_kv_tokens=1_000_000,
            step=rng.choice([0, 20, 50, 100, 7]) + p,
        )
        now += rng.uniform(0.001, 0.5)
        for r in running:
            r.generated += 1
            r.attained_service += 1
            if r.first_token_time is None and rng.random() < 0.5:
                r.first_token_time = now
        for r in waiting:
            if rng.random() < 0.1:
                r.prefix_cached = rng.choice([0, r.prompt_len // 3])
            if rng.random() < 0.1:
                r.best_effort_tier = not r.best_effort_tier
            if rng.random() < 0.05:
                r.predicted_output_len = rng.choice([None, 77.0])
        rng.shuffle(waiting)
        if waiting and rng.random() < 0.5:
            started = waiting.pop()
            started.first_token_time, started.generated = now, 1
            running.append(started)
        if running and rng.random() < 0.3:
            waiting.insert(0, running.pop(0))  # retracted
        for _ in range(rng.randrange(0, 4)):
            waiting.append(_request(rng, f"w{fresh}", now, False, shared))
            fresh += 1


def with_duplicate_rids(view: EngineView) -> EngineView:
    """`view` with rids queued twice: one view listed twice, another view under a taken rid."""
    waiting = list(view.waiting)
    if len(waiting) >= 2:
        waiting += [waiting[0], replace(waiting[1], arrival=waiting[1].arrival - 0.5)]
    return replace(view, waiting=waiting)
