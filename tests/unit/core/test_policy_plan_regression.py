"""The optimised Tempo and GMAX policies must decide exactly as the frozen reference copies in
_reference_policies/ (the implementation before the decision-latency work) did.

Seeded random multi-step scenarios drive a reference and an optimised policy side by side over
the same sequence of EngineViews: arrivals, progress, admissions, finishes, engine retractions,
quantum/frame boundaries, small batches (preemption), best-effort work, compound programs,
shared and re-used SloSpec objects, re-used rids, ties, and max_queue_ms drops. Every StepPlan
(and the scores and GMAX's tuned cutoff) must match exactly.
"""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from scheduler.core.policies.gmax import GmaxPolicy, power_of_k
from scheduler.core.policies.tempo import TempoPolicy
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView, StepPlan
from tests.unit.core._reference_policies.gmax import GmaxPolicy as RefGmax
from tests.unit.core._reference_policies.gmax import power_of_k as ref_power_of_k
from tests.unit.core._reference_policies.tempo import TempoPolicy as RefTempo

SHARED_SLOS = (
    SloSpec(ttft_ms=500, tpot_ms=50, slo_class=SloClass.LATENCY),
    SloSpec(deadline_ms=20_000, slo_class=SloClass.DEADLINE, weight=2.0),
    SloSpec(),
    SloSpec(max_queue_ms=300.0),
)


def _slo(rng: random.Random) -> SloSpec:
    if rng.random() < 0.15:
        return rng.choice(SHARED_SLOS)  # one SloSpec object shared by many requests
    kind = rng.choice(list(SloClass))
    weight = rng.choice([1.0, 1.0, 0.5, 2.0, rng.uniform(0.1, 5.0)])
    max_queue = rng.choice([None, None, None, rng.uniform(50.0, 3000.0)])
    if kind is SloClass.LATENCY:
        ttft = rng.choice([200.0, 500.0, rng.uniform(20.0, 3000.0)])
        tpot = rng.choice([None, 25.0, 50.0, rng.uniform(5.0, 150.0)])
        return SloSpec(ttft_ms=ttft, tpot_ms=tpot, slo_class=kind, weight=weight, max_queue_ms=max_queue)
    if kind is SloClass.DEADLINE:
        return SloSpec(
            deadline_ms=rng.choice([1000.0, 10e3, rng.uniform(50.0, 60e3)]),
            slo_class=kind,
            weight=weight,
            max_queue_ms=max_queue,
        )
    if kind is SloClass.COMPOUND:
        return SloSpec(
            deadline_ms=rng.choice([5e3, 30e3, rng.uniform(100.0, 60e3)]),
            slo_class=kind,
            program_id=rng.choice([None, "p1", "p2", "p3", "p4"]),
            stage=rng.choice([0, 1, 2, "plan"]),
            weight=weight,
            max_queue_ms=max_queue,
        )
    return SloSpec(weight=weight, max_queue_ms=max_queue)


def _new_request(rng: random.Random, rid: str, now: float) -> RequestView:
    slo = _slo(rng)
    # Coarse arrival grid: ties in arrival (and so in priority) exercise the tie-breaks.
    arrival = now - rng.choice([0.0, 0.0, 0.25, 0.5, rng.uniform(0.0, 5.0)])
    prompt = rng.choice([1, 16, 128, 512, int(rng.lognormvariate(5.5, 1.2)) + 1])
    compound = slo.slo_class is SloClass.COMPOUND
    return RequestView(
        rid=rid,
        slo=slo,
        arrival=arrival,
        prompt_len=prompt,
        max_new_tokens=rng.choice([None, 64, 256, 1024, rng.randrange(1, 3000)]),
        predicted_output_len=rng.choice([None, 100.0, rng.lognormvariate(4.5, 1.0)]),
        prefix_cached=rng.choice([0, 0, prompt // 2, prompt, prompt + 5]),
        program_arrival=(arrival - rng.choice([0.0, 1.0, 3.0])) if compound and rng.random() < 0.8 else None,
        stage_deadline=(now + rng.uniform(0.1, 20.0)) if compound and rng.random() < 0.3 else None,
        attained_service=rng.choice([0.0, rng.uniform(0.0, 5000.0)]),
        best_effort_tier=rng.random() < 0.1,
    )


class Scenario:
    """A small seeded engine: requests arrive, wait, run, finish or get retracted."""

    def __init__(self, seed: int, cap: int, chunk: int, dt: float) -> None:
        self.rng = random.Random(seed)
        self.cap = cap
        self.chunk = chunk
        self.dt = dt
        self.now = 100.0
        self.step = 0
        self.waiting: list[RequestView] = []
        self.running: list[RequestView] = []
        self.next_id = 0
        self.finished: list[str] = []

    def _rid(self) -> str:
        rng = self.rng
        if self.finished and rng.random() < 0.05:
            return self.finished.pop(rng.randrange(len(self.finished)))  # a client re-used a rid
        self.next_id += 1
        return f"q{self.next_id}"

    def view(self) -> EngineView:
        total = 100_000
        used = sum(r.prompt_len + r.generated for r in self.running)
        return EngineView(
            now=self.now,
            waiting=list(self.waiting),
            running=list(self.running),
            max_running_requests=self.cap,
            chunk_size=self.chunk,
            free_kv_tokens=max(0, total - used),
            total_kv_tokens=total,
            step=self.step,
        )

    def advance(self, plan: StepPlan) -> None:
        rng = self.rng
        dropped = set(plan.drop)
        preempted = set(plan.preempt)
        self.waiting = [r for r in self.waiting if r.rid not in dropped]
        # Retract the planned victims (engine keeps their progress, they wait to resume).
        back = [r for r in self.running if r.rid in preempted]
        self.running = [r for r in self.running if r.rid not in preempted]
        # Progress of running requests; some finish.
        still: list[RequestView] = []
        for r in self.running:
            gen = r.generated + rng.choice([1, 1, 1, 2, 5])
            first = r.first_token_time if r.first_token_time is not None else self.now
            pred = r.predicted_output_len
            if pred is not None and rng.random() < 0.2:
                pred = max(1.0, pred + rng.uniform(-20.0, 40.0))  # the analyzer revises its bound
            r2 = replace(
                r,
                generated=gen,
                first_token_time=first,
                predicted_output_len=pred,
                attained_service=r.attained_service + gen,
            )
            if rng.random() < 0.08 or (r.max_new_tokens is not None and gen >= r.max_new_tokens):
                self.finished.append(r.rid)
            else:
                still.append(r2)
        self.running = still
        # The engine sometimes retracts on its own (KV pressure).
        if self.running and rng.random() < 0.1:
            back.append(self.running.pop(rng.randrange(len(self.running))))
        # Admit in the plan's order up to the cap.
        pos = {rid: i for i, rid in enumerate(plan.order or [])}
        ranked = sorted(self.waiting, key=lambda r: pos.get(r.rid, len(pos)))
        free = max(0, self.cap - len(self.running))
        admitted, self.waiting = ranked[:free], ranked[free:]
        self.running.extend(admitted)
        self.waiting.extend(back)
        rng.shuffle(self.waiting)  # engines do not keep the waiting queue in any fixed order
        # Arrivals (sometimes a burst), and a program's earlier call surfacing late.
        self.now += self.dt * rng.choice([0.5, 1.0, 1.0, 3.0])
        self.step += rng.choice([1, 1, 1, 2, 3])
        for _ in range(rng.choice([0, 1, 2, 5, 20])):
            self.waiting.append(_new_request(rng, self._rid(), self.now))
        if self.waiting and rng.random() < 0.1:
            i = rng.randrange(len(self.waiting))
            r = self.waiting[i]
            if r.program_arrival is not None:
                self.waiting[i] = replace(r, program_arrival=r.program_arrival - 0.5)


def _seed_queue(sc: Scenario, n: int) -> None:
    for _ in range(n):
        sc.waiting.append(_new_request(sc.rng, sc._rid(), sc.now))


def _assert_same_plan(got: StepPlan, want: StepPlan, where: str) -> None:
    assert got.order == want.order, where
    assert got.preempt == want.preempt, where
    assert list(got.drop.items()) == list(want.drop.items()), where
    assert got.best_effort == want.best_effort, where
    assert (got.batch_cap, got.chunk_size, got.spec_steps) == (want.batch_cap, want.chunk_size, want.spec_steps), where


def _same_array(x: np.ndarray, y: np.ndarray) -> bool:
    return x.shape == y.shape and bool(np.array_equal(x, y, equal_nan=True))


TEMPO_KW = (
    {},
    {"quantum_steps": 3, "reserve_share": 0.3, "fairness": 0.3, "preempt_margin": 0.1},
    {"quantum_steps": 1, "reserve_share": 0.0, "alpha": 2.0, "w_in": 0.5, "w_out": 3.0},
    {"preempt": False, "reserve_share": 1.0, "default_output_len": 64},
)
GMAX_KW = (
    {},
    {"frame_steps": 3, "tune_epoch_frames": 1, "fairness": 0.2, "preempt_margin": 0.0},
    {"frame_steps": 1, "cutoff": 0.5, "aging_delta": 0.0, "tune_cutoff": False},
    {"enforce_max_queue": False, "preempt": False, "cutoff": 1.0, "default_output_len": 64},
)
SCENARIOS = (  # (cap, chunk, dt, initial queue)
    (2, 64, 0.02, 10),
    (8, 512, 0.05, 40),
    (4, 1, 0.01, 5),
    (64, 8192, 0.2, 300),
)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("which", ["tempo", "gmax"])
def test_optimised_policies_plan_exactly_like_the_reference(seed: int, which: str) -> None:
    cap, chunk, dt, initial = SCENARIOS[seed % len(SCENARIOS)]
    kw_list = TEMPO_KW if which == "tempo" else GMAX_KW
    kw = kw_list[seed % len(kw_list)]
    new, ref = (TempoPolicy(**kw), RefTempo(**kw)) if which == "tempo" else (GmaxPolicy(**kw), RefGmax(**kw))
    if seed % 2:
        new._slos.slack = 0  # evict the per-SloSpec cache often, not only when it is huge
    sc = Scenario(seed, cap, chunk, dt)
    _seed_queue(sc, initial)
    stats = {"preempt": 0, "drop": 0, "steps": 0}
    for _ in range(60):
        view = sc.view()
        where = f"{which} seed={seed} step={view.step}"
        if which == "tempo":
            assert _same_array(new.densities(view), ref.densities(view)), where
        else:
            assert _same_array(new.priorities(view), ref.priorities(view)), where
            assert new.cutoff == ref.cutoff, where
        want = ref.plan(view)
        got = new.plan(view)
        _assert_same_plan(got, want, where)
        stats["preempt"] += len(want.preempt)
        stats["drop"] += len(want.drop)
        stats["steps"] += 1
        sc.advance(want)
    assert stats["steps"] == 60


def test_regression_scenarios_exercise_preemption_and_drops() -> None:
    """Guard against the scenarios above going vacuous: over all of them, the reference
    preempts and drops at least sometimes."""
    totals = {"tempo_preempt": 0, "gmax_preempt": 0, "gmax_drop": 0}
    for seed in range(8):
        cap, chunk, dt, initial = SCENARIOS[seed % len(SCENARIOS)]
        for which in ("tempo", "gmax"):
            kw_list = TEMPO_KW if which == "tempo" else GMAX_KW
            ref = RefTempo(**kw_list[seed % len(kw_list)]) if which == "tempo" else RefGmax(**GMAX_KW[seed % 4])
            sc = Scenario(seed, cap, chunk, dt)
            _seed_queue(sc, initial)
            for _ in range(60):
                plan = ref.plan(sc.view())
                totals[f"{which}_preempt"] += len(plan.preempt)
                if which == "gmax":
                    totals["gmax_drop"] += len(plan.drop)
                sc.advance(plan)
    assert all(v > 0 for v in totals.values()), totals


def _bench_view(n: int, running: int, seed: int) -> EngineView:
    rng = random.Random(seed)
    sc = Scenario(seed, 64, 8192, 0.05)
    sc.rng = rng
    _seed_queue(sc, n + running)
    sc.running, sc.waiting = sc.waiting[:running], sc.waiting[running:]
    sc.running = [replace(r, generated=rng.randrange(1, 300), first_token_time=sc.now - 0.5) for r in sc.running]
    return sc.view()


@pytest.mark.parametrize("n", [0, 1, 3000])
def test_single_large_and_degenerate_views_match(n: int) -> None:
    for step in (0, 7, 50, 60):
        view = replace(_bench_view(n, 0 if n == 1 else 64, seed=n + step), step=step)
        for new, ref in ((TempoPolicy(), RefTempo()), (GmaxPolicy(), RefGmax())):
            _assert_same_plan(new.plan(view), ref.plan(view), f"{new.name} n={n} step={step}")


def test_power_of_k_matches_the_reference() -> None:
    views = [_bench_view(n, 16, seed=n) for n in (5, 50, 200)]
    sc = Scenario(99, 4, 512, 0.1)
    for i in range(20):
        req = _new_request(sc.rng, f"new{i}", views[0].now)
        for k in (1, 2, 3):
            want = ref_power_of_k(req, views, k=k, rng=np.random.default_rng(i))
            got = power_of_k(req, views, k=k, rng=np.random.default_rng(i))
            assert got == want
