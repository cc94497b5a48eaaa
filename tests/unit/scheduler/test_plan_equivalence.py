"""One plan path: the simulator and the SGLang adapter finish a policy's plan identically.

A seeded workload of every SLO class runs through the simulator, which records each step's view
and finished plan; the adapter's planner (scheduler/components/planner.py, the object the SGLang
scheduler asks every pass) is then fed the same views with a fresh policy of the same name and
must return the same plans, step for step: drops (queue timeouts included), tiers, order,
preemptions, batch cap and chunk.
"""

from __future__ import annotations

import random

import pytest

from scheduler.components.planner import PassPlanner
from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from scheduler.core.plan_path import LeverModel, settings_for
from scheduler.core.policies import POLICIES, make_policy
from scheduler.core.sim import EngineConfig, SimRequest, Simulator
from scheduler.core.slo import SloClass, SloSpec

PERF = RooflinePerfModel([RooflineTerm(k_tokens=2e-4, k_spec=0.0, k_kv=2e-8, b=0.01, k_seqs=1e-4)])
ENGINE_POLICIES = sorted(name for name in POLICIES if not name.endswith("_oracle"))


def _workload(seed: int, n: int = 60) -> list[SimRequest]:
    rng = random.Random(seed)
    requests, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(12.0)
        kind = rng.choice(list(SloClass))
        queue_ms = rng.choice([None, None, 300.0])
        if kind is SloClass.LATENCY:
            tpot = rng.choice([None, 20.0, 60.0])
            slo = SloSpec(ttft_ms=rng.uniform(100, 800), tpot_ms=tpot, slo_class=kind, max_queue_ms=queue_ms)
        elif kind is SloClass.DEADLINE:
            slo = SloSpec(deadline_ms=rng.uniform(500, 4000), slo_class=kind, max_queue_ms=queue_ms)
        elif kind is SloClass.COMPOUND:
            slo = SloSpec(deadline_ms=6000.0, slo_class=kind, program_id=f"p{i % 4}", stage=i % 3)
        else:
            slo = SloSpec(max_queue_ms=queue_ms)
        output = rng.randint(4, 120)
        requests.append(
            SimRequest(
                f"r{i}",
                slo,
                t,
                prompt_len=rng.randint(16, 900),
                output_len=output,
                max_new_tokens=output * 2,
                predicted_output_len=output * rng.uniform(0.8, 1.6),
            )
        )
    return requests


@pytest.mark.parametrize("mixed", [True, False], ids=["mixed", "separate"])
@pytest.mark.parametrize("policy_name", ENGINE_POLICIES)
def test_the_adapters_planner_finishes_every_recorded_plan_as_the_simulator_did(policy_name: str, mixed: bool) -> None:
    policy = make_policy(policy_name, PERF)
    settings = settings_for(policy, mixed_batching=mixed)
    config = EngineConfig(max_running_requests=12, chunk_size=256, total_kv_tokens=40_000)
    sim = Simulator(policy, PERF, config, settings=settings, record_trace=True)
    result = sim.run(_workload(seed=7), max_steps=3000)
    assert len(result.trace) > 100 and any(plan.drop for _, plan in result.trace)

    planner = PassPlanner(make_policy(policy_name, PERF), settings)
    for step, (view, simulated) in enumerate(result.trace):
        served = planner.plan(view, LeverModel(PERF))
        assert served == simulated, f"step {step}: the adapter's plan differs from the simulator's"
    assert planner.errors == 0
    if settings.levers:
        assert any(plan.batch_cap is not None for _, plan in result.trace)  # the shared levers applied
