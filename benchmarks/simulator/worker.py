"""One simulated worker: an engine plus what its worker agent tells the router.

The live worker's agent (server/worker_agent.py) registers, watches its requests' streams and
sends a LoadReport every `report_s`; the router turns registration and report into the
WorkerView its policy reads (router/protocol.py). Here the agent's own `LoadEstimator` runs on
the simulator's clock and is fed the same observations (a request sent, its first token, its
token gaps, the tokens served), and the report goes through the same `LoadReport` and
`load_report_to_view`, so a routing policy reads the numbers it would read live.

Two shortcuts keep a step O(1) at hundreds of workers: tokens served are added to the
tokens-per-minute window once per report, not per chunk (the window is 60 s, a report 0.25 s),
and the decode-gap EMA takes a step's n equal samples (every decoding request waited the same
step) in closed form, v <- (1-w)^n v + (1 - (1-w)^n) gap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.simulator.card import Card
from benchmarks.simulator.pool import sglang_chunk
from benchmarks.simulator.speculative_decoding import APART
from router.protocol import LoadReport, Register
from router.report_views import load_report_to_view, register_to_view
from router.routing_views import WorkerView
from scheduler.components.meter import PREFILL_PROBE_TOKENS
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, live_length_bounds
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import make_policy
from scheduler.core.sim_engine import EngineConfig, SimEngine, Speculation, StepOutcome
from scheduler.core.types import Policy
from server.agent_load import LoadEstimator, queued_s

PREFILL, DECODE = "prefill", "decode"


@dataclass(frozen=True)
class EngineOptions:
    """How every engine of the pool is configured (SGLang's flags, in effect)."""

    policy: str = "fcfs"
    policy_params: tuple[tuple[str, object], ...] = ()
    max_running: int = 256
    chunk: int | None = None  # SGLang's chunked_prefill_size; None: its default for the card's memory
    mixed: bool = True  # mixed prefill+decode steps (the server's default on GPUs)
    stock_fcfs: bool = True  # fcfs runs as stock SGLang: separate prefill steps
    overlap: bool = True  # SGLang's overlap schedule (its default on GPUs): arrivals wait one pass more
    length_predictor: str | None = DEFAULT_LENGTH_PREDICTOR  # --slo-length-predictor (each engine learns its own)


class SimWorker:
    def __init__(
        self,
        worker_id: str,
        card: Card,
        role: str,
        options: EngineOptions,
        clock: Callable[[], float],
        speculation: Speculation | None = None,
        spec_layout: str = APART,
        prefix_block_tokens: int = 0,
    ) -> None:
        self.worker_id = worker_id
        self.card = card
        self.role = role
        self.clock = clock
        self.registration_gpu, card_model = card.name.split("/")[0], card.name.split("/")[-1]
        policy: Policy = make_policy(options.policy, card.plan_with, **dict(options.policy_params))
        mixed = options.mixed and not (options.policy == "fcfs" and options.stock_fcfs)
        mixed = mixed and (speculation is None or spec_layout != APART)  # STANDALONE runs prefill apart
        settings = settings_for(policy, mixed_batching=mixed, role=role)
        chunk = options.chunk if options.chunk is not None else sglang_chunk(self.registration_gpu, card_model)
        startup = None
        if role == PREFILL and settings.apply_levers:
            chunk = startup = 2 * chunk  # dynamic chunking starts SGLang at 2B, runs at B
        self.engine = SimEngine(
            policy,
            card.pace,
            EngineConfig(
                max_running_requests=options.max_running,
                chunk_size=chunk,
                total_kv_tokens=card.kv_tokens,
                prefix_block_tokens=prefix_block_tokens,
                overlap=options.overlap,
            ),
            settings,
            plan_perf=card.plan_with,
            speculation=speculation,
            startup_chunk=startup,
            lengths=live_length_bounds(options.length_predictor),
        )
        self.registration = Register(
            worker_id=worker_id,
            gpu=card.name.split("/")[0],
            model=card.name.split("/")[-1],
            kv_capacity_tokens=card.kv_tokens,
            max_running=options.max_running,
            role=role,
            bootstrap_port=1 if role == PREFILL else None,
            slo_levers=settings.levers,
        )
        self.view: WorkerView = register_to_view(self.registration, clock())
        # the agent's side
        self.load = LoadEstimator(clock=clock)
        self.prefill_s_per_token = card.plan_with.step_time(PREFILL_PROBE_TOKENS, 0, 0) / PREFILL_PROBE_TOKENS
        self._status_constants = {
            "perf_model": {"predicted_decode_ms": {"1": 1000.0 * card.plan_with.step_time(0, 1, 128)}},
            "prefill_ms_per_token": round(1000.0 * self.prefill_s_per_token, 6),
        }
        self._no_first_token: dict[str, tuple[float, int]] = {}  # rid -> (sent, prompt tokens)
        self._served = 0  # tokens since the last report
        self._last_decode: float | None = None
        self._seq = 0
        # engine stepping, driven by the cluster's event loop
        self.step_end: float | None = None
        self.kick_pending = False

    # ---- the agent's observations ------------------------------------------------------------
    def sent(self, rid: str, prompt_tokens: int) -> None:
        """The router sent a request here (Submit): the agent starts its stream."""
        now = self.clock()
        self._served += prompt_tokens
        self._no_first_token[rid] = (now, prompt_tokens)

    def forgot(self, rid: str) -> None:
        """The request left without a first token here (aborted, migrated)."""
        self._no_first_token.pop(rid, None)

    def observe(self, outcome: StepOutcome) -> None:
        """A step's chunks as the agent's stream reader sees them."""
        for req, t in outcome.first_tokens:
            sent = self._no_first_token.pop(req.rid, None)
            if sent is not None:
                self.load.first_token(t - sent[0], sent[1], self.prefill_s_per_token)
        self._served += outcome.emitted
        if outcome.decodes:
            # a request's previous chunk came at the last decode step, or (nothing decoded since)
            # with its first token, at the latest when this step began
            since = self._last_decode if self._last_decode is not None else outcome.start
            per_token = (outcome.end - since) * outcome.decodes / max(outcome.decode_tokens, 1)
            ema = self.load.decode
            keep = (1.0 - ema.weight) ** outcome.decodes
            ema.value = per_token if ema.value is None else keep * ema.value + (1.0 - keep) * per_token
            self._last_decode = outcome.end
        if not self.engine.n_decoding:
            self._last_decode = None

    def report(self) -> LoadReport:
        """The agent's LoadReport now, and the router's view of it."""
        now = self.clock()
        if self._served:
            self.load.served(self._served)
            self._served = 0
        engine = self.engine
        status = {
            "steps": engine.steps,
            "time": now,
            "waiting": len(engine.waiting),
            "running": len(engine.running),
            "kv_used_tokens": engine.kv_used,
            "decode_step_ms": 1000.0 * self.card.plan_with.step_time(0, max(1, len(engine.running)), engine.kv_used),
            **self._status_constants,
        }
        p = self.prefill_s_per_token
        waits = [queued_s(now - sent, prompt, p) for sent, prompt in self._no_first_token.values()]
        self._seq += 1
        return LoadReport(worker_id=self.worker_id, seq=self._seq, **self.load.report_fields(status, waits))

    def view_from(self, report: LoadReport, inflight: int, report_s: float) -> WorkerView:
        """The registry's view: the report as it arrived at `report_s`, the router's in-flight count."""
        return load_report_to_view(report, inflight, report_s, None, registration=self.registration)
