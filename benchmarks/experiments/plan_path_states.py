"""Engine states for the decision-latency benchmark: the usual mix at a given depth, and states
built to be the worst case of some policy's plan, each as SGLang-shaped requests.

The usual mix (`make_view`): seeded synthetic requests of every SLO class (interactive and tight
latency, deadline, compound, best effort). The adversarial states (`adversarial_states`), each
aimed at what makes one policy's pass slow, read off the policies themselves:

- `forced`: a full batch (nothing admitted can start), a few running prompts still in prefill
  and a deep queue of open latency requests with long TTFTs: the SLOs-Serve DP
  (scheduler/core/slos_serve/dp.py) admits up to its candidates every pass and they stay
  forced, so the forced set grows pass after pass; some running prompts are already past
  their first token's due time, and the rest cannot all make theirs, so every pass decides the
  most urgent items again (scheduler/core/slos_serve/soft_admission.py);
- `tiers`: deadlines spread over three decades and TPOTs all distinct, so the DP's state space
  (decoders per tier) and the ladder of derived tiers are as wide as they get;
- `compound`: every request a compound call, most in a few very large stages and the rest in
  hundreds of small ones (Tempo's and GMAX's per-stage reductions, GMAX's grouped goodput);
- `ties`: a burst: one arrival instant, one SLO, one length, so every sort key ties (EDF's and
  SJF's lexsort fallback, SLOs-Serve's rid tie-break of equal prefill deadlines);
- `preempt`: each pass at a preemption boundary (Tempo's and LAS's quanta, GMAX's frames) with a
  queue of dense, short, new requests against weak, long, well-served running ones, so the
  victim walks go as far as they can.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from scheduler.core.clock import WallClock
from scheduler.core.slo import SloClass, SloSpec
from scheduler.core.types import EngineView, RequestView
from wire import ARRIVAL_PARAM, SLO_PARAM, TOKEN_TS_KEY

ENGINE_NOW = 1000.0
RUNNING = 256  # the running batch of every plan-path state
FORCED_PREFILLING = 8  # running prompts still in prefill in the `forced` state

# (weight in the mix, SloSpec factory): shares loosely follow a chat-heavy production mix.
CLASSES = (
    (0.35, lambda rng, i: SloSpec(ttft_ms=500, tpot_ms=50, slo_class=SloClass.LATENCY)),
    (0.15, lambda rng, i: SloSpec(ttft_ms=200, tpot_ms=25, slo_class=SloClass.LATENCY)),
    (0.20, lambda rng, i: SloSpec(deadline_ms=rng.choice([10e3, 30e3, 60e3]), slo_class=SloClass.DEADLINE)),
    (
        0.10,
        lambda rng, i: SloSpec(
            deadline_ms=30e3, slo_class=SloClass.COMPOUND, program_id=f"p{i % 97}", stage=rng.randrange(4)
        ),
    ),
    (0.20, lambda rng, i: SloSpec()),
)


def engine_request(rng: random.Random, i: int, running: bool) -> RequestView:
    factory = rng.choices([f for _, f in CLASSES], weights=[w for w, _ in CLASSES])[0]
    slo = factory(rng, i)
    arrival = ENGINE_NOW - rng.uniform(0.0, 3.0)
    prompt = int(min(16_000, rng.lognormvariate(6.2, 1.0)))
    generated = rng.randrange(1, 300) if running else 0
    program_arrival = arrival - rng.uniform(0, 5) if slo.slo_class is SloClass.COMPOUND else None
    return RequestView(
        rid=f"{'r' if running else 'w'}{i}",
        slo=slo,
        arrival=arrival,
        prompt_len=prompt,
        generated=generated,
        max_new_tokens=rng.choice([256, 512, 1024, 2048]),
        predicted_output_len=rng.lognormvariate(5.0, 0.8) if rng.random() < 0.7 else None,
        first_token_time=arrival + 0.2 if running else None,
        prefix_cached=rng.choice([0, 0, 0, prompt // 2]),
        program_arrival=program_arrival,
        attained_service=rng.uniform(0, 2000) if slo.slo_class is SloClass.COMPOUND else 0.0,
    )


def make_view(queued: int, running: int, seed: int = 0) -> EngineView:
    rng = random.Random(seed)
    return EngineView(
        now=ENGINE_NOW,
        waiting=[engine_request(rng, i, False) for i in range(queued)],
        running=[engine_request(rng, i, True) for i in range(running)],
        max_running_requests=256,
        chunk_size=8192,
        free_kv_tokens=600_000,
        total_kv_tokens=1_000_000,
        step=10,
    )


@dataclass(frozen=True)
class PlanState:
    """One benchmark state: its requests, and the engine step of pass k (`step_of`)."""

    name: str
    waiting: list[RequestView]
    running: list[RequestView]
    step_of: Callable[[int], int] = lambda k: k  # a real engine's step count: a boundary now and then
    prefilling: int = 0  # the first this many running requests stay in prefill (no decode step)


def usual_state(queued: int, seed: int | None = None, running: int = RUNNING) -> PlanState:
    view = make_view(queued, running, seed=queued if seed is None else seed)
    return PlanState(f"{queued:,}", list(view.waiting), list(view.running))


def _latency(rng: random.Random, ttft: tuple[float, float], tpot: tuple[float, float]) -> SloSpec:
    return SloSpec(ttft_ms=round(rng.uniform(*ttft)), tpot_ms=round(rng.uniform(*tpot), 1), slo_class=SloClass.LATENCY)


def forced_state(queued: int = 1_000, seed: int = 1) -> PlanState:
    rng = random.Random(seed)
    running = []
    for i in range(RUNNING):
        arrival = ENGINE_NOW - rng.uniform(0, 2.0)
        slo = _latency(rng, (500, 4_000), (100, 300))  # TPOTs a full batch can keep: the DP has states
        started = i >= FORCED_PREFILLING
        running.append(
            RequestView(
                f"r{i}",
                slo,
                arrival,
                rng.randrange(200, 8_000),
                generated=rng.randrange(1, 200) if started else 0,
                max_new_tokens=1024,
                first_token_time=arrival + 0.1 if started else None,
            )
        )
    waiting = [
        RequestView(
            f"w{i}",
            _latency(rng, (5_000, 60_000), (100, 300)),
            ENGINE_NOW - rng.uniform(0, 0.5),
            rng.randrange(50, 4_000),
            max_new_tokens=rng.choice([128, 512, 2048]),
        )
        for i in range(queued)
    ]
    return PlanState("forced", waiting, running, prefilling=FORCED_PREFILLING)


def tiers_state(queued: int = 1_000, seed: int = 2) -> PlanState:
    rng = random.Random(seed)

    def slo(running: bool) -> SloSpec:  # running: TPOTs a full batch keeps, so the DP has states
        if not running and rng.random() < 0.5:
            return SloSpec(deadline_ms=10 ** rng.uniform(3.3, 6.3), slo_class=SloClass.DEADLINE)
        return _latency(rng, (300, 10_000), (90, 400) if running else (8, 400))

    def req(i: int, running: bool) -> RequestView:
        arrival = ENGINE_NOW - rng.uniform(0, 2.0)
        return RequestView(
            f"{'r' if running else 'w'}{i}",
            slo(running),
            arrival,
            rng.randrange(50, 4_000),
            generated=rng.randrange(1, 200) if running else 0,
            max_new_tokens=rng.choice([64, 256, 1024, 4096]),
            predicted_output_len=rng.uniform(20, 2_000),
            first_token_time=arrival + 0.1 if running else None,
        )

    return PlanState("tiers", [req(i, False) for i in range(queued)], [req(i, True) for i in range(RUNNING)])


def compound_state(queued: int = 1_000, seed: int = 3) -> PlanState:
    rng = random.Random(seed)

    def req(i: int, running: bool) -> RequestView:
        program = f"big{rng.randrange(5)}" if rng.random() < 0.5 else f"p{rng.randrange(500)}"
        slo = SloSpec(
            deadline_ms=rng.choice([5e3, 30e3, 120e3]), slo_class=SloClass.COMPOUND, program_id=program, stage=0
        )
        arrival = ENGINE_NOW - rng.uniform(0, 3.0)
        return replace(
            engine_request(rng, i, running),
            slo=slo,
            arrival=arrival,
            first_token_time=arrival + 0.2 if running else None,
        )

    return PlanState("compound", [req(i, False) for i in range(queued)], [req(i, True) for i in range(RUNNING)])


def ties_state(queued: int = 1_000, seed: int = 4) -> PlanState:
    rng = random.Random(seed)
    slo = SloSpec(ttft_ms=5_000, tpot_ms=50, slo_class=SloClass.LATENCY)
    waiting = [RequestView(f"w{i}", slo, ENGINE_NOW - 0.1, 512, max_new_tokens=512) for i in range(queued)]
    running = [replace(engine_request(rng, i, True), slo=slo) for i in range(RUNNING)]
    return PlanState("ties", waiting, running)


def preempt_state(queued: int = 1_000, seed: int = 5) -> PlanState:
    rng = random.Random(seed)
    waiting = [
        RequestView(
            f"w{i}",
            _latency(rng, (2_000, 5_000), (40, 100)),
            ENGINE_NOW - rng.uniform(0, 0.05),
            rng.randrange(20, 200),
            max_new_tokens=32,
            predicted_output_len=rng.uniform(8, 32),
        )
        for i in range(queued)
    ]
    running = []
    for i in range(RUNNING):
        arrival = ENGINE_NOW - rng.uniform(20, 25)
        slo = SloSpec(deadline_ms=600e3, slo_class=SloClass.DEADLINE) if i % 2 else SloSpec()
        running.append(
            RequestView(
                f"r{i}",
                slo,
                arrival,
                rng.randrange(100, 400),
                generated=rng.randrange(200, 400),
                max_new_tokens=8192,
                first_token_time=arrival + 0.1,
            )
        )
    # every pass a boundary of every quantum (20) and frame (50) length in use
    return PlanState("preempt", waiting, running, step_of=lambda k: 100 * (k + 1))


def adversarial_states(queued: int = 1_000) -> list[PlanState]:
    return [
        forced_state(queued),
        tiers_state(queued),
        compound_state(queued),
        ties_state(queued),
        preempt_state(queued),
    ]


# -- SGLang's side of a state -------------------------------------------------------------------


class Params:
    """The two SamplingParams fields the adapter reads."""

    def __init__(self, max_new_tokens: int, custom_params: dict[str, Any]) -> None:
        self.max_new_tokens = max_new_tokens
        self.custom_params = custom_params


class SglReq:
    """An SGLang Req as the adapter's view builder reads it."""

    def __init__(self, view: RequestView, now_unix: float, prefilling: bool = False) -> None:
        self.rid = view.rid
        shift = now_unix - ENGINE_NOW
        custom = {SLO_PARAM: view.slo.to_dict(), ARRIVAL_PARAM: view.arrival + shift}
        self.sampling_params = Params(view.max_new_tokens or 1024, custom)
        self.origin_input_ids = list(range(view.prompt_len))
        self.output_ids = [0] * view.generated
        stamps = [view.arrival + shift + 0.2 + 0.02 * i for i in range(view.generated)]
        self.customized_info = {TOKEN_TS_KEY: stamps} if stamps else None
        self.prefix_len = view.prefix_cached
        self.prefilling = prefilling  # a long prompt chunked over many passes: no token yet

    def decode_one(self, now_unix: float) -> None:
        """What a decode step does to a running request: one more output token, stamped."""
        if self.prefilling:
            return
        self.output_ids.append(0)
        if self.customized_info is None:
            self.customized_info = {TOKEN_TS_KEY: []}
        self.customized_info[TOKEN_TS_KEY].append(now_unix)


def sglang_reqs(state: PlanState, clock: WallClock) -> tuple[list[SglReq], list[SglReq]]:
    """(waiting, running) Reqs of `state`, its times shifted to `clock`'s now."""
    now = clock.now()
    running = [SglReq(r, now, i < state.prefilling) for i, r in enumerate(state.running)]
    return [SglReq(r, now) for r in state.waiting], running
