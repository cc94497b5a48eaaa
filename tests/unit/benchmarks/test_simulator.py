"""The cluster simulator's mechanics, on small synthetic workloads (no trace files needed)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from benchmarks.goodput.records import PlannedRequest
from benchmarks.goodput.scoring import score
from benchmarks.simulator.cluster import ClusterConfig, ClusterSim
from benchmarks.simulator.engine import simulate
from benchmarks.simulator.pool import KV_BYTES_PER_TOKEN, PoolSpec, card
from benchmarks.simulator.prefixes import prefix_hashes
from benchmarks.simulator.speculative_decoding import SimSpeculation
from benchmarks.simulator.worker import EngineOptions
from benchmarks.workloads.traces import TraceRequest
from router.policies.base import RoutingPolicy
from router.routing_views import Decision, RouteRequest, RunningView, WorkerView
from scheduler.core.sim_engine import StepOutcome


def planned_requests(n: int = 60, rate: float = 30.0, seed: int = 0, chain_every: int = 7) -> list[PlannedRequest]:
    """Latency and deadline requests with Poisson arrivals; every `chain_every`-th starts a
    two-stage program (the second stage sent when the first finishes)."""
    rng = random.Random(seed)
    out, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(rate)
        prompt, output = rng.randint(50, 1500), rng.randint(5, 300)
        if i % chain_every == 0:
            pid = f"p{i}"
            first = TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=output, rid=f"r{i}a", program_id=pid)
            second = TraceRequest(
                arrival_s=t, prompt_tokens=200, output_tokens=20, rid=f"r{i}b", program_id=f"p{i}", parents=(f"r{i}a",)
            )
            body = {"class": "compound", "deadline_ms": 20000.0, "program_id": f"p{i}"}
            out.append(PlannedRequest(first, "compound", {**body, "stage": 0}, program_deadline_ms=20000.0))
            out.append(PlannedRequest(second, "compound", {**body, "stage": 1}, program_deadline_ms=20000.0))
            continue
        req = TraceRequest(arrival_s=t, prompt_tokens=prompt, output_tokens=output, rid=f"r{i}")
        if i % 2:
            out.append(PlannedRequest(req, "latency", {"class": "latency", "ttft_ms": 400.0, "tpot_ms": 40.0}))
        else:
            out.append(PlannedRequest(req, "deadline", {"class": "deadline", "deadline_ms": 5000.0}))
    return sorted(out, key=lambda p: p.req.arrival_s)


def config(pool: str = "h100:1", routing: str = "round_robin", policy: str = "fcfs", **kw: object) -> ClusterConfig:
    return ClusterConfig(pool=PoolSpec.parse(pool), engine=EngineOptions(policy=policy), routing=routing, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["fcfs", "gmax"])
def test_one_worker_cluster_is_the_single_engine_simulator(policy: str) -> None:
    planned = planned_requests()
    alone = simulate(planned, policy, card("h100"))
    clustered = ClusterSim(config(policy=policy, migrate_interval_s=None)).run(planned).records
    assert [(r.key, r.send_s, r.token_s, r.finish_s) for r in alone] == [
        (r.key, r.send_s, r.token_s, r.finish_s) for r in clustered
    ]


def test_host_latency_delays_the_engine_not_the_send_and_is_not_scaled() -> None:
    planned = planned_requests(n=1, chain_every=1000)[:1]  # one lone request
    req = planned[0].req
    plain = ClusterSim(config(time_scale=4.0)).run(planned).records[0]
    hosted = ClusterSim(config(time_scale=4.0, host_latency_s=0.012)).run(planned).records[0]
    assert hosted.send_s == plain.send_s == pytest.approx(req.arrival_s)
    prefill = 4.0 * card("h100").pace.step_time(req.prompt_tokens, 0, req.prompt_tokens)
    assert plain.token_s[0] == pytest.approx(req.arrival_s + prefill)
    assert hosted.token_s == pytest.approx([t + 0.012 for t in plain.token_s])  # real time, not x4


def test_runs_are_deterministic_and_every_request_ends() -> None:
    planned = planned_requests(n=80, rate=60.0)
    cfg = config("h100:2,a40:2", routing="power_of_two", policy="tempo")
    a, b = ClusterSim(cfg).run(planned), ClusterSim(cfg).run(planned)
    assert [(r.key, r.token_s) for r in a.records] == [(r.key, r.token_s) for r in b.records]
    m = score(a.records)
    assert m.finished == m.requests and m.lost == 0 and m.never_sent == 0
    for r in a.records:
        assert len(r.token_s) == r.target_output_tokens
        assert r.token_s == sorted(r.token_s) and r.token_s[0] >= r.send_s
    assert a.counters["decisions"] == len(planned) and len(a.decision_ns) == len(planned)


def test_streamed_scores_equal_scoring_the_kept_records() -> None:
    planned = planned_requests(n=60, rate=80.0)
    kept = ClusterSim(config("h100:2", routing="least_request")).run(planned)
    streamed = ClusterSim(config("h100:2", routing="least_request", stream_scores=True)).run(planned)
    assert streamed.records == [] and kept.records
    assert streamed.metrics(10.0) == kept.metrics(10.0) == score(kept.records, duration_s=10.0)


def test_pd_pairs_prefill_then_decode_with_the_kv_transfer_time() -> None:
    planned = planned_requests(n=1, chain_every=1000)[:1]  # one lone request, alone in the pool
    cfg = config("h100:1:prefill,h100:1:decode", kv_link_gb_s=10.0, kv_latency_s=0.002)
    sim = ClusterSim(cfg)
    rec = sim.run(planned).records[0]
    req = planned[0].req
    prefill_end = card("h100").pace.step_time(req.prompt_tokens, 0, req.prompt_tokens)
    transfer = 0.002 + (req.prompt_tokens + 1) * KV_BYTES_PER_TOKEN["llama3-8b"] / 10e9
    assert rec.token_s[0] == pytest.approx(req.arrival_s + prefill_end + transfer)
    assert len(rec.token_s) == req.output_tokens
    prefill, decode = sim.workers
    assert prefill.engine.decode_times == prefill.engine.decode_times[:0]  # the prefill worker never decodes
    assert len(decode.engine.decode_times) == req.output_tokens - 1


class _MoveOnce(RoutingPolicy):
    """Everything to the first worker; at the first migration check, the oldest request moves."""

    name = "move_once"

    def __init__(self) -> None:
        self.moved: list[tuple[str, str]] = []

    def choose(self, req: RouteRequest, workers: Sequence[WorkerView], now: float) -> Decision:
        return Decision(workers[0].worker_id)

    def migrations(
        self, running: Sequence[RunningView], workers: Sequence[WorkerView], now: float
    ) -> list[tuple[str, str]]:
        started = [r for r in running if r.generated >= 3]
        if self.moved or not started:
            return []
        self.moved.append((started[0].request.rid, workers[1].worker_id))
        return list(self.moved)


def test_migration_resumes_on_the_target_after_the_delivered_tokens() -> None:
    planned = planned_requests(n=6, rate=5.0, chain_every=1000)
    policy = _MoveOnce()
    sim = ClusterSim(config("h100:2", migrate_interval_s=0.01), routing_policy=lambda ctx: policy)
    result = sim.run(planned)
    assert result.counters["migrated"] == 1
    rid = policy.moved[0][0]
    rec = next(r for r in result.records if r.key == rid)
    assert rec.finished and len(rec.token_s) == rec.target_output_tokens  # no token lost or repeated
    assert rec.token_s == sorted(rec.token_s)
    assert sim.workers[1].engine.steps > 0  # the target re-prefilled and decoded the rest


def test_load_reports_reach_the_router_views() -> None:
    planned = planned_requests(n=100, rate=200.0, chain_every=1000)
    sim = ClusterSim(config("a40:2", routing="round_robin"))
    seen: list[WorkerView] = []
    original = sim.router.on_report

    def spy(worker_id: str, report: object) -> None:
        original(worker_id, report)  # type: ignore[arg-type]
        seen.extend(sim.router.current_views())

    sim.router.on_report = spy  # type: ignore[method-assign]
    sim.run(planned)
    assert any(v.running > 0 for v in seen) and any(v.queue_delay_s > 0 for v in seen)
    assert any(v.decode_s_per_token > 0 for v in seen) and all(v.gpu == "a40" for v in seen)


def test_speculation_draws_follow_the_acceptance_model() -> None:
    spec = SimSpeculation("fixed:3", alpha=0.6, draft_ratio=0.1, seed=1)
    draws = [a for _ in range(2000) for a in spec.accept(8, 3)]
    expected = sum(0.6**j for j in range(1, 4))  # E[min(G, s)] = sum over j of P(accepted >= j)
    assert sum(draws) / len(draws) == pytest.approx(expected, rel=0.03)
    assert min(draws) == 0 and max(draws) == 3


def test_speculative_decoding_emits_more_tokens_per_step_and_the_controller_learns() -> None:
    # a TPOT no plain decode step keeps: the SLO controller drafts only where the TPOTs bind
    planned = [
        PlannedRequest(p.req, p.cls, {**p.slo, "tpot_ms": 2.0} if "tpot_ms" in p.slo else p.slo)
        for p in planned_requests(n=20, rate=5.0, chain_every=1000)
    ]
    plain = ClusterSim(config(policy="slos")).run(planned)
    sim = ClusterSim(config(policy="slos", speculation="slo", spec_alpha=0.8))
    spec = sim.run(planned)
    assert sum(w["steps"] for w in spec.workers.values()) < sum(w["steps"] for w in plain.workers.values())
    controller = sim.workers[0].engine.spec.controller  # type: ignore[union-attr]
    assert controller.acceptance.verifies > 0 and controller.acceptance.alpha == pytest.approx(0.8, abs=0.1)
    assert all(len(r.token_s) == r.target_output_tokens for r in spec.records)


@pytest.mark.parametrize(
    "layout, decodes_beside_prefill, drafts_beside_prefill",
    [("apart", False, False), ("decode-only", True, False), ("in-verify", True, True)],
)
def test_where_prefill_goes_under_speculation(
    layout: str, decodes_beside_prefill: bool, drafts_beside_prefill: bool
) -> None:
    """STANDALONE runs prefill in steps of its own; EAGLE's mixed steps decode beside a prefill
    without drafts; SLOs-Serve's verify batches carry both. Seen in each step's output: a step
    that sends a first token carried prefill; drafts show as more decode tokens than decodes."""
    sim = ClusterSim(config(policy="edf", speculation="fixed:3", spec_alpha=0.9, spec_layout=layout))
    worker, outcomes = sim.workers[0], []
    observe = worker.observe

    def spy(outcome: StepOutcome) -> None:
        outcomes.append(outcome)
        observe(outcome)

    worker.observe = spy  # type: ignore[method-assign]
    sim.run(planned_requests(n=60, rate=30.0))
    beside = [o for o in outcomes if o.first_tokens and o.decodes]
    alone = [o for o in outcomes if not o.first_tokens and o.decodes]
    assert any(o.decode_tokens > o.decodes for o in alone)  # decode-only steps draft in every layout
    assert bool(beside) is decodes_beside_prefill
    assert any(o.decode_tokens > o.decodes for o in beside) is drafts_beside_prefill


def test_shared_trace_prefix_blocks_hash_alike_and_the_engine_reuses_them() -> None:
    a = TraceRequest(arrival_s=0.0, prompt_tokens=1100, output_tokens=4, rid="a", prefix_hash_ids=(1, 2, 3))
    b = TraceRequest(arrival_s=0.5, prompt_tokens=1100, output_tokens=4, rid="b", prefix_hash_ids=(1, 2, 9))
    ha, hb = prefix_hashes(a, 512), prefix_hashes(b, 512)
    assert len(ha) == 1100 // 64 and ha[:16] == hb[:16] and ha[16] != hb[16]  # blocks 0-15 lie in ids 1, 2
    planned = [PlannedRequest(r, "none", {}) for r in (a, b)]
    cached = ClusterSim(config()).run(planned)
    fresh = ClusterSim(config(prefix_cache=False)).run(planned)
    ttft = [run.records[1].token_s[0] - 0.5 for run in (cached, fresh)]
    h100 = card("h100").pace
    assert ttft[0] == pytest.approx(h100.step_time(1100 - 1024, 0, 1100))  # b skipped the shared 1024 tokens
    assert ttft[1] == pytest.approx(h100.step_time(1100, 0, 1100))


def test_pool_specs() -> None:
    spec = PoolSpec.parse("h100:2:prefill,h100:3:decode,a40:1")
    assert spec.size == 6 and spec.is_pd
    assert [w[0] for w in spec.workers()] == ["h100-0", "h100-1", "h100-2", "h100-3", "h100-4", "a40-5"]
    assert spec.cost_per_hour({"h100": 4.0, "a40": 1.0}) == 21.0
    for bad in ("h100", "h100:2:prefill", "h100:x", "h100:1:bogus"):
        with pytest.raises(ValueError):
            PoolSpec.parse(bad)
