"""What a simulated engine is given and reports: the requests (with their hidden true length),
the engine's limits, its prefix cache, the speculation hook, each request's state inside the
engine and what one step did. scheduler/core/sim_engine.py is the engine built on them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.core.plan_path import LeverModel
from scheduler.core.slo import SloSpec
from scheduler.core.types import EngineView, PerfModel, RequestView

KV_TOO_LARGE = "kv_too_large"
PREFILLED = "prefilled"  # a PD prefill engine's hand-off: the first token exists, decoding goes elsewhere


@dataclass
class SimRequest:
    """A workload item: what the client sends plus the true output length (hidden)."""

    rid: str
    slo: SloSpec
    arrival: float
    prompt_len: int
    output_len: int  # true length; never shown to the policy
    max_new_tokens: int | None = None
    predicted_output_len: float | None = None
    program_arrival: float | None = None
    stage_deadline: float | None = None
    parents: tuple[str, ...] = ()  # rids that must finish first: it arrives think_s after the last
    think_s: float = 0.0
    generated: int = 0  # output tokens it arrives with (a PD decode engine's hand-off)
    prefix_hashes: tuple[int, ...] = ()  # chained hashes of its prompt's leading blocks (prefix reuse)
    tenant: str | None = None  # the API key it came with (fair shares between keys)
    share: float = 1.0  # that key's share


@dataclass
class EngineConfig:
    max_running_requests: int = 8
    chunk_size: int = 512
    total_kv_tokens: int = 1 << 20
    prefix_block_tokens: int = 0  # > 0: a prefix cache of blocks this size (requests' prefix_hashes)
    overlap: bool = False  # SGLang's overlap schedule: the next pass is formed while this one runs


class PrefixCache:
    """The engine's radix cache, as far as a simulator needs it: which leading prompt blocks were
    computed here recently (an LRU bounded by the KV capacity). An admitted request's matched
    blocks are not prefilled again; the cache's own KV is not counted against admissions."""

    def __init__(self, block_tokens: int, max_blocks: int) -> None:
        self.block_tokens = block_tokens
        self.max_blocks = max(1, max_blocks)
        self._lru: dict[int, None] = {}

    def cached_tokens(self, hashes: Sequence[int], prompt_len: int) -> int:
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            n += 1
        return min(n * self.block_tokens, max(prompt_len - 1, 0))  # the last token is always computed

    def insert(self, hashes: Sequence[int]) -> None:
        lru = self._lru
        for h in hashes:
            lru.pop(h, None)
            lru[h] = None
        while len(lru) > self.max_blocks:
            del lru[next(iter(lru))]


class Speculation(Protocol):
    """Speculative decoding on one engine: the drafting length, its cost and its acceptance.
    `decode_only`: a step that carries prefill runs its decodes without drafts (SGLang's EAGLE
    with mixed batches); else every decode step drafts."""

    decode_only: bool

    def steps(self) -> int:
        """Drafted tokens per decoding request in the next decode step (0: no speculation)."""
        ...

    def lever_model(self, plan_perf: PerfModel) -> LeverModel:
        """What the levers are sized with at the current length."""
        ...

    def step_time(self, pace: PerfModel, prefill_tokens: int, decodes: int, kv_tokens: int, steps: int) -> float:
        """Seconds of one step: the verify pass plus the draft passes."""
        ...

    def accept(self, decodes: int, steps: int) -> Sequence[int]:
        """Accepted drafts per decoding request of a verify (and learn from them)."""
        ...

    def update(self, view: EngineView, plan_perf: PerfModel) -> None:
        """Re-decide the length for the running requests (every pass, as the adapter does)."""
        ...


@dataclass(eq=False)
class RequestState:
    req: SimRequest
    gen_base: int = 0  # tokens generated up to the current decode segment's start
    prefill_target: int = 0  # context to (re)compute on admission: prompt + tokens so far
    prefilled: int = 0  # progress towards prefill_target
    first_token_time: float | None = None
    pieces: list[float | tuple[int, int]] = field(default_factory=list)  # token times: one, or a decode-step range
    emitted: int = 0  # token times in `pieces`
    admitted_seq: int = 0
    preemptions: int = 0
    be_tier: bool = False
    decoding: bool = False  # running, prefilled: gains a token in every decode step
    seg_start: int = 0  # the engine's decode-step index where the current decode segment began
    epoch: int = 0  # bumped when a decode segment ends: stale finish-heap entries are skipped
    removed: bool = False  # taken away mid-step (migration): dropped silently at the step's end
    key: str = ""  # whose attained service it counts towards: its program, else itself
    view: RequestView | None = None
    view_settled: bool = False  # its view cannot change while it waits (refreshed since it last ran)

    def __post_init__(self) -> None:
        self.key = self.req.slo.program_id or self.req.rid

    @property
    def needs_prefill(self) -> bool:
        return self.prefilled < self.prefill_target


@dataclass
class Finished:
    """A request that left the engine: finished (`reason` None), dropped, or handed off."""

    req: SimRequest
    token_times: list[float]
    time: float
    reason: str | None
    preemptions: int


@dataclass
class StepOutcome:
    """What one step did, for the caller's bookkeeping (load reports, records)."""

    end: float
    start: float
    finished: list[Finished]
    first_tokens: list[tuple[SimRequest, float]]  # requests whose first token this step emitted
    decodes: int  # requests that decoded in this step
    emitted: int  # output tokens emitted
    decode_tokens: int = 0  # of which by decoding requests (speculation: 1 + accepted drafts each)


@dataclass
class RunningStep:
    """A step between begin_step and end_step."""

    start: float
    end: float
    prefill: list[tuple[RequestState, int]]
    decodes: int  # running requests decoding in it (PD decode: besides those joining now)
    joined: list[RequestState]  # PD decode: admitted with their KV, decoding from this step on
    spec_steps: int
