"""Everything the adapter keeps, built from the server's SLO settings before SGLang's own
scheduler initialises (SGLang's init already calls some of the adapter's overrides)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.components.adapter_state import EngineStart, PassState, SloCounters
from scheduler.components.meter import EngineMeter
from scheduler.components.pd_chunking import PrefillChunker
from scheduler.components.planner import PassPlanner
from scheduler.components.rank_sync import PassSync
from scheduler.components.request_state import RequestStates
from scheduler.components.views import ViewBuilder
from scheduler.config import SloServerConfig
from scheduler.core.analyzer.graph import PatternLibrary, load_deepresearch
from scheduler.core.analyzer.online import BoundAccuracy, LiveLengthBounds
from scheduler.core.analyzer.spec import predictor_from_spec
from scheduler.core.clock import Clock, WallClock
from scheduler.core.compound import CompoundDeadlines
from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.pacing import Pacer, SlowedPerfModel
from scheduler.core.perf_model import load_perf_model
from scheduler.core.plan_path import settings_for
from scheduler.core.policies import dilated_params, make_policy
from scheduler.core.policies.oracle import ORACLE_SUFFIX
from scheduler.core.speculation_controller import SloSpeculation
from scheduler.core.types import PerfModel

logger = logging.getLogger("sglang_slo.scheduler")


@dataclass
class SloComponents:
    """The adapter's wired components (set-up), and its state apart: what the engine started
    with, the pass in progress with its applied plan, and the counters."""

    config: SloServerConfig
    clock: Clock
    perf: OnlinePerfModel
    meter: EngineMeter
    planner: PassPlanner
    states: RequestStates
    views: ViewBuilder
    compound: CompoundDeadlines
    accuracy: BoundAccuracy
    lengths: LiveLengthBounds | None
    levers_on: bool  # fcfs stays stock SGLang: no batch cap, no chunk
    spec: SloSpeculation | None = None  # set when the draft worker is built
    chunker: PrefillChunker | None = None  # PD prefill workers under an SLO policy
    sync: PassSync = field(default_factory=PassSync)  # TP ranks: the leader's decisions on every rank
    started: EngineStart = field(default_factory=EngineStart)  # set once SGLang's init is done
    pass_state: PassState = field(default_factory=PassState)  # the pass in progress, its applied plan
    counters: SloCounters = field(default_factory=SloCounters)  # what /slo/status publishes

    def start_dynamic_chunking(self, startup_chunk: int, page_size: int) -> None:
        self.chunker = PrefillChunker(startup_chunk, page_size)
        self.started.chunk_budget = self.chunker.budget

    def spec_alpha(self) -> float | None:
        """The SLO speculation controller's acceptance rate (None without one)."""
        return None if self.spec is None else self.spec.acceptance.alpha

    def on_finished(self, rid: str, prompt_tokens: int, output_tokens: int, now: float, answered: bool = True) -> None:
        """`answered` False: aborted, so its length is no answer's length (nothing learns from it)."""
        state = self.states.forget(rid)
        self.views.forget(rid)
        if self.lengths is not None:
            if answered:
                app = state.slo.program_id if state is not None else None
                entry = self.lengths.finished(rid, app, output_tokens)
            else:
                entry = self.lengths.forget(rid)
            if entry is not None and answered and math.isfinite(entry.initial):  # inf: no guess yet
                self.accuracy.record(entry.initial, output_tokens)
        if state is not None and state.slo.program_id is not None:
            self.compound.on_finish(state.slo.program_id, state.slo.stage, prompt_tokens, output_tokens, now)

    def forget_departed(self, live: set[str]) -> None:
        """States of requests that left without finishing in a forward pass (aborts, drops)."""
        if len(self.states) > 4 * (len(live) + 1024):
            self.states.keep_only(live)
            self.views.keep_only(live)

    def emulation_status(self, kv_token_capacity: int, stand_in_forward: bool) -> dict[str, Any] | None:
        pacer = self.meter.pacer
        if pacer is None:
            return None
        return {
            "gpu_model": self.config.emulate_name,
            "slowdown": self.config.emulate_slowdown,
            "kv_token_capacity": kv_token_capacity,
            "stand_in_forward": stand_in_forward,
            **pacer.report().to_dict(),
        }


def _pattern_library(path: str | None) -> PatternLibrary:
    """Seed patterns (deep-research JSON format) plus whatever the server learns online."""
    library = PatternLibrary()
    if path:
        for graph in load_deepresearch(Path(path)):
            library.add(graph)
        logger.info("%d program patterns loaded from %s", len(library), path)
    return library


def _length_bounds(spec: str | None, quantile: float | None) -> LiveLengthBounds | None:
    predictor = predictor_from_spec(spec)
    if predictor is None:
        return None
    if quantile is not None:
        if not hasattr(predictor, "quantile"):
            raise ValueError(f"predictor {predictor.name} has no quantile to set")
        predictor.quantile = quantile
    logger.info("length predictor %s (%s)", predictor.name, spec)
    return LiveLengthBounds(predictor)


def build_components(
    config: SloServerConfig, prior: PerfModel | None = None, clock: Clock | None = None
) -> SloComponents:
    """`prior`: a perf model trusted as is (default: the config's profile, if any); `clock`:
    the scheduler's clock (default: wall time, the domain of the arrival stamps)."""
    profile, emulate = config.perf_profile, config.emulate_profile
    slowdown = config.emulate_slowdown if emulate else 1.0
    if prior is None and profile:
        prior = SlowedPerfModel(load_perf_model(profile, kind="roofline"), slowdown)
    perf = OnlinePerfModel(prior)
    pacer = Pacer(SlowedPerfModel(load_perf_model(emulate, kind="table"), slowdown)) if emulate else None
    policy = make_policy(config.policy, perf, **dilated_params(config.policy, config.policy_params, slowdown))
    levers_on = config.policy != "fcfs"
    clock = clock if clock is not None else WallClock()
    states = RequestStates()
    compound = CompoundDeadlines(_pattern_library(config.program_patterns))
    lengths = _length_bounds(config.length_predictor, config.predictor_quantile)
    views = ViewBuilder(
        states,
        clock,
        compound,
        lengths=lengths,
        oracle=config.policy.endswith(ORACLE_SUFFIX),
    )
    return SloComponents(
        config=config,
        clock=clock,
        perf=perf,
        meter=EngineMeter(perf, pacer, timing_ok=True, emulated_card=config.emulate_name),
        planner=PassPlanner(policy, settings_for(policy, tenant_fairness=config.tenant_fairness)),
        states=states,
        views=views,
        compound=compound,
        accuracy=BoundAccuracy(),
        lengths=lengths,
        levers_on=levers_on,
    )
