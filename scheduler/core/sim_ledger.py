"""A simulated engine's state and its token bookkeeping: which requests wait, run and prefill,
the KV they hold, and each request's tokens, kept as decode segments that follow from the
engine's decode-step counter so that a step never walks the running batch (see sim_engine.py).
SimEngine builds on it (views, batching, the step loop); its constructor is this one."""

from __future__ import annotations

import functools
import heapq
from array import array
from collections.abc import Callable

from scheduler.core.analyzer.online import LiveLengthBounds
from scheduler.core.columns import RowCache
from scheduler.core.dynamic_chunking import budget_from_startup
from scheduler.core.fairness import FairShare
from scheduler.core.plan_path import PREFILL, FinalPlan, LeverModel, PlanSettings
from scheduler.core.policies.oracle import ORACLE_SUFFIX
from scheduler.core.sim_requests import (
    EngineConfig,
    Finished,
    PrefixCache,
    RequestState,
    RunningStep,
    SimRequest,
    Speculation,
)
from scheduler.core.types import EngineView, PerfModel, Policy


def _bound(lengths: LiveLengthBounds, r: SimRequest, generated: int) -> float | None:
    return lengths.bound(r.rid, str, r.prompt_len, r.slo.program_id, generated)


class SimLedger:
    """The engine's state (set up here for SimEngine) and what each request has generated,
    emitted and holds in KV."""

    def __init__(
        self,
        policy: Policy,
        perf: PerfModel,
        config: EngineConfig,
        settings: PlanSettings,
        plan_perf: PerfModel | None = None,
        predictor: Callable[[SimRequest, int], float | None] | None = None,
        record_trace: bool = False,
        speculation: Speculation | None = None,
        startup_chunk: int | None = None,
        lengths: LiveLengthBounds | None = None,
    ) -> None:
        if lengths is not None:
            if predictor is not None:
                raise ValueError("give a predictor or length bounds, not both")
            predictor = functools.partial(_bound, lengths)
        self.lengths = lengths  # as the server's --slo-length-predictor: answered requests teach it
        self.policy = policy
        # benchmarks' *_oracle policies only are shown the true length, as the adapter does
        self.oracle = policy.name.endswith(ORACLE_SUFFIX)
        self.perf = perf
        self.plan_perf = plan_perf if plan_perf is not None else perf
        self.cfg = config
        self.settings = settings
        self.predictor = predictor
        self.record_trace = record_trace
        self.spec = speculation
        self.lever_model = LeverModel(self.plan_perf)
        # A state's view keeps RowCache's contract (only per-pass fields are refreshed); a
        # recorded trace builds new views every pass, which a cache would only pile up.
        self._row_cache = None if record_trace else RowCache()
        self._fair = FairShare()  # tenants' served-token counters across passes (fair shares)
        self.waiting: list[RequestState] = []
        self.running: dict[int, RequestState] = {}  # admitted_seq -> state: admission order, O(1) removal
        self.prefilling: list[RequestState] = []  # running requests still prefilling, in admission order
        self.kv_used = 0  # KV tokens held by running requests
        self.n_decoding = 0
        self.decode_times = array("d")  # end time of every step that decoded
        self.steps = 0
        self.plans: list[tuple[int, FinalPlan]] = []  # plans that preempted or dropped
        self.trace: list[tuple[EngineView, FinalPlan]] = []
        self._finish_at: list[tuple[int, int, int, RequestState]] = []  # (decode index, seq, epoch, state)
        self._attained: dict[str, float] = {}  # program (or rid) -> tokens served, decode segments folded in
        self._by_rid: dict[str, RequestState] = {}
        self._seq = 0
        self._chunk = config.chunk_size  # the adapter keeps the last plan's chunk for passes it does not plan
        # PD prefill under an SLO policy: PolyServe dynamic chunking (started at 2B, normal steps at B)
        dynamic = settings.role == PREFILL and settings.apply_levers and startup_chunk
        self._chunk_budget = budget_from_startup(startup_chunk) if dynamic and startup_chunk else None
        self._startup_chunk = startup_chunk
        self._step: RunningStep | None = None
        self.prefix = (
            PrefixCache(config.prefix_block_tokens, config.total_kv_tokens // config.prefix_block_tokens)
            if config.prefix_block_tokens > 0
            else None
        )
        self._dropped: list[Finished] = []  # the last plan's drops, until the caller takes them
        self._removed: list[RequestState] = []  # taken away while in the running step
        # overlap schedule: requests queued since the last begin_step, rows finished in the last step
        self._fresh: list[RequestState] = []
        self._ghosts = 0
        self._last_end: float | None = None

    def generated(self, st: RequestState) -> int:
        return st.gen_base + (len(self.decode_times) - st.seg_start if st.decoding else 0)

    def emitted(self, rid: str) -> int | None:
        """Tokens this engine has emitted for `rid` so far (None: not here)."""
        st = self._by_rid.get(rid)
        if st is None:
            return None
        return st.emitted + (len(self.decode_times) - st.seg_start if st.decoding else 0)

    def tokens(self, rid: str) -> list[float] | None:
        """Token times this engine has emitted for `rid` so far (None: not here)."""
        st = self._by_rid.get(rid)
        return None if st is None else self.tokens_of(st)

    def tokens_of(self, st: RequestState) -> list[float]:
        """Token times so far (decode segments materialised from the engine's step times)."""
        out: list[float] = []
        times = self.decode_times
        for p in st.pieces:
            if isinstance(p, tuple):
                out.extend(times[p[0] : p[1]])
            else:
                out.append(p)
        if st.decoding and len(times) > st.seg_start:
            out.extend(times[st.seg_start :])
        return out

    def _start_decoding(self, st: RequestState, done: list[RequestState]) -> None:
        """`st` now holds its first (or resumed) token: it decodes from the next decode step on."""
        if st.gen_base >= st.req.output_len:
            done.append(st)
            return
        st.decoding = True
        st.seg_start = len(self.decode_times)
        self.n_decoding += 1
        if self.spec is None:
            finish_index = st.seg_start + st.req.output_len - st.gen_base - 1
            heapq.heappush(self._finish_at, (finish_index, st.admitted_seq, st.epoch, st))

    def _end_segment(self, st: RequestState) -> None:
        if not st.decoding:
            return
        n = len(self.decode_times)
        gained = n - st.seg_start
        if gained > 0:
            st.pieces.append((st.seg_start, n))
            st.emitted += gained
            st.gen_base += gained
            key = st.key
            self._attained[key] = self._attained.get(key, 0.0) + gained
        st.decoding = False
        st.epoch += 1
        self.n_decoding -= 1

    def _materialise(self, st: RequestState) -> list[float]:
        self._end_segment(st)
        return self.tokens_of(st)

    def _leave_running(self, st: RequestState) -> None:
        """Out of the running batch (finished, preempted, retracted, removed): its KV is freed."""
        if self.running.pop(st.admitted_seq, None) is None:
            return
        context = st.req.prompt_len + self.generated(st)
        self.kv_used -= context if not st.needs_prefill else st.prefilled
        self._end_segment(st)
        if st.needs_prefill:
            self.prefilling = [s for s in self.prefilling if s is not st]

    def _reset_prefill(self, st: RequestState) -> None:
        """Preempted or retracted: it keeps its tokens and recomputes its KV when resumed."""
        st.prefilled = st.prefill_target = 0
        st.preemptions += 1

    def _spec_decode(self, step: RunningStep, t: float, done: list[RequestState]) -> int:
        """Speculative decode: each decoding request gains 1 + its accepted drafts (at most what
        is left of its answer), all at the step's end."""
        assert self.spec is not None
        joined = {id(s) for s in step.joined}
        decoding = [st for st in self.running.values() if st.decoding and id(st) not in joined]
        if not step.decodes or not decoding:
            return 0
        steps = step.spec_steps
        accepted = self.spec.accept(len(decoding), steps) if steps > 0 else [0] * len(decoding)
        emitted = 0
        for st, extra in zip(decoding, accepted):
            k = min(1 + int(extra), st.req.output_len - st.gen_base)
            st.gen_base += k
            st.pieces.extend([t] * k)
            st.emitted += k
            self.kv_used += k
            key = st.key
            self._attained[key] = self._attained.get(key, 0.0) + k
            emitted += k
            if st.gen_base >= st.req.output_len:
                done.append(st)
        return emitted
