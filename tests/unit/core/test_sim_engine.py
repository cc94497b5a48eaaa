"""The steppable engine under both simulators: when it plans, what it emits, what leaves it."""

from __future__ import annotations

import pytest

from scheduler.core.analyzer.spec import COLD_START, live_length_bounds
from scheduler.core.perf_model import constant_model, linear_model
from scheduler.core.plan_path import DECODE, PREFILL, settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim_engine import SimEngine
from scheduler.core.sim_requests import PREFILLED, EngineConfig, SimRequest
from scheduler.core.slo import SloSpec
from scheduler.core.types import EngineView, StepPlan
from tests.unit.core.policy_cases import RecordingPolicy

TAU = 0.01


def engine(policy: object, role: str = "mixed", **cfg: int) -> SimEngine:
    config = EngineConfig(max_running_requests=cfg.get("batch", 4), chunk_size=cfg.get("chunk", 64))
    return SimEngine(policy, constant_model(TAU), config, settings_for(policy, role=role))  # type: ignore[arg-type]


def run(e: SimEngine, t: float = 0.0) -> float:
    while True:
        end = e.begin_step(t)
        if end is None:
            return t
        e.end_step()
        t = end


def test_a_pass_is_planned_only_while_a_request_waits_or_is_prefilled() -> None:
    policy = RecordingPolicy()
    e = engine(policy)
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=8, output_len=10))
    run(e)
    assert e.steps == 10 and len(policy.views) == 1  # admitted at the first pass, never asked again
    # A prompt prefilled in three chunks: each chunk's pass is planned (as the adapter plans
    # SGLang's chunked_req), the decode passes after it are not.
    policy = RecordingPolicy()
    e = engine(policy, chunk=4)
    e.add(SimRequest("b", SloSpec(), 0.0, prompt_len=10, output_len=5))
    run(e)
    assert e.steps == 7 and len(policy.views) == 3 and [len(v.waiting) for v in policy.views] == [1, 0, 0]


def test_tokens_come_one_per_decode_step_after_the_prefill() -> None:
    e = engine(RecordingPolicy(), chunk=4)
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=10, output_len=3))
    end = e.begin_step(0.0)
    outcomes = []
    while end is not None:
        outcomes.append(e.end_step())
        end = e.begin_step(end)
    finished = [f for o in outcomes for f in o.finished]
    assert len(finished) == 1 and finished[0].reason is None
    # 10 prompt tokens in chunks of 4: steps 1-3 prefill (the third emits the first token), 4-5 decode
    assert finished[0].token_times == [3 * TAU, 4 * TAU, 5 * TAU]
    assert [o.first_tokens for o in outcomes][2][0][0].rid == "a"
    assert e.kv_used == 0 and len(e) == 0


def test_a_request_removed_mid_step_leaves_at_its_end_with_the_tokens_it_had() -> None:
    e = engine(RecordingPolicy())
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=8, output_len=50))
    t = 0.0
    for _ in range(5):
        t = e.begin_step(t) or t
        e.end_step()
    e.begin_step(t)
    taken = e.remove("a")
    assert taken is not None and len(taken[1]) == 5
    outcome = e.end_step()
    assert outcome.finished == [] and len(e) == 0 and e.kv_used == 0 and e.n_decoding == 0


def test_a_pd_prefill_engine_hands_off_after_the_first_token() -> None:
    e = engine(make_policy("fcfs"), role=PREFILL, chunk=128)
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=100, output_len=20))
    e.begin_step(0.0)
    outcome = e.end_step()
    (f,) = outcome.finished
    assert f.reason == PREFILLED and f.token_times == [TAU] and e.kv_used == 0


def test_a_pd_decode_engine_admits_with_the_kv_and_streams_the_first_token_at_once() -> None:
    e = engine(make_policy("fcfs"), role=DECODE)
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=100, output_len=3, generated=1))
    end = e.begin_step(0.0)
    first = e.end_step()
    assert first.first_tokens[0][1] == 0.0 and e.kv_used == 102  # prompt + first token + this step's
    e.begin_step(end or 0.0)
    (f,) = e.end_step().finished
    assert f.token_times == [0.0, TAU, 2 * TAU]


def overlap_engine(policy: object) -> SimEngine:
    config = EngineConfig(max_running_requests=4, chunk_size=64, overlap=True)
    return SimEngine(policy, constant_model(TAU), config, settings_for(policy))  # type: ignore[arg-type]


def test_overlap_an_arrival_during_a_pass_waits_for_the_pass_after_the_next() -> None:
    """SGLang's overlap schedule forms pass N+1 when pass N starts: a request queued while N
    runs is not in N+1 but in N+2 (the simulator's TTFT gap against the emulated server)."""
    firsts = {}
    for overlap in (False, True):
        policy = RecordingPolicy()
        e = overlap_engine(policy) if overlap else engine(policy)
        e.add(SimRequest("long", SloSpec(), 0.0, prompt_len=8, output_len=40))
        t = e.begin_step(0.0)
        assert t is not None
        e.end_step()
        e.add(SimRequest("late", SloSpec(), t, prompt_len=8, output_len=2))  # queued during pass 1
        while "late" not in firsts.setdefault(overlap, {}):
            end = e.begin_step(t)
            assert end is not None
            for req, when in e.end_step().first_tokens:
                firsts[overlap][req.rid] = when
            t = end
    assert firsts[False]["late"] == 2 * TAU  # formed into pass 2
    assert firsts[True]["late"] == 3 * TAU  # pass 2 was already formed: pass 3


def test_overlap_a_finished_request_decodes_once_more_and_an_idle_engine_takes_arrivals_at_once() -> None:
    e = overlap_engine(RecordingPolicy())
    e.add(SimRequest("a", SloSpec(), 0.0, prompt_len=8, output_len=2))
    t, ends = 0.0, []
    while e.has_work:
        end = e.begin_step(t)
        assert end is not None
        e.end_step()
        ends.append(end)
        t = end
    # prefill+first token, one decode (it finishes), then the ghost pass formed before its end
    assert ends == [TAU, 2 * TAU, 3 * TAU] and len(e) == 0
    # Arriving during the ghost pass it was formed without: nothing else runs, so it is not held.
    e.add(SimRequest("b", SloSpec(), t, prompt_len=8, output_len=1))
    assert e.begin_step(t) == t + TAU
    assert [r.rid for r, _ in e.end_step().first_tokens] == ["b"]


def test_a_step_is_charged_for_the_kv_it_attends_as_the_emulator_keys_it() -> None:
    """A prefill-only step (separate batching) reads only the prompt's own KV, not the running
    decoders'; a mixed step reads both. Charging every running context to a prefill step made
    stock fcfs (separate) slower in the simulator than on the emulated server."""
    model = linear_model(base_s=0.01, per_token_s=1e-5, per_seq_s=1e-4, per_kv_token_s=1e-6)
    for mixed in (False, True):
        policy = RecordingPolicy()
        config = EngineConfig(max_running_requests=4, chunk_size=4096)
        e = SimEngine(policy, model, config, settings_for(policy, mixed_batching=mixed))  # type: ignore[arg-type]
        e.add(SimRequest("long", SloSpec(), 0.0, prompt_len=3000, output_len=50))
        t = 0.0
        for _ in range(3):  # its prefill, then two decode steps
            end = e.begin_step(t)
            assert end is not None
            e.end_step()
            t = end
        e.add(SimRequest("new", SloSpec(), t, prompt_len=100, output_len=5))
        end = e.begin_step(t)
        assert end is not None
        if mixed:  # the decoder (its 3000-token prompt and 3 tokens out) rides along
            expected = model.step_time(100, 1, 100 + 3003)
        else:
            expected = model.step_time(100, 0, 100)
        assert end - t == pytest.approx(expected)


class BoundsSeen(RecordingPolicy):
    """Records the length bound each waiting request is planned with."""

    def __init__(self) -> None:
        super().__init__()
        self.bounds: dict[str, float | None] = {}

    def plan(self, view: EngineView) -> StepPlan:
        self.bounds.update({r.rid: r.predicted_output_len for r in view.waiting})
        return StepPlan()


def test_length_bounds_are_learned_from_answered_requests_as_the_server_learns_them() -> None:
    policy = BoundsSeen()
    config = EngineConfig(max_running_requests=1, chunk_size=64)
    lengths = live_length_bounds("history:0.9")
    e = SimEngine(policy, constant_model(TAU), config, settings_for(policy), lengths=lengths)  # type: ignore[arg-type]
    t = 0.0
    for i in range(COLD_START + 5):  # one at a time: each is planned after the ones before answered
        e.add(SimRequest(f"r{i}", SloSpec(), t, prompt_len=8, output_len=30, max_new_tokens=1024))
        t = run(e, t)
    assert policy.bounds["r0"] is None  # nothing learned yet: the client's cap bounds it
    assert policy.bounds[f"r{COLD_START}"] == 30.0  # every answer so far had 30 tokens
    assert len(lengths) == 0  # answered requests are forgotten
