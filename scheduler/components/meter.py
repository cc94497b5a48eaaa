"""Measuring the engine: each forward pass's shape and time, for the online perf model; under
GPU emulation, each pass paced to the emulated card's time.

`batch_shape` reads from SGLang's ScheduleBatch: forward_mode, reqs, decoding_reqs (mixed
batches), and per Req origin_input_ids, output_ids, prefix_len, extend_end.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Hashable
from typing import Any

from scheduler.components.step_timer import GpuStepTimer, TimedStep
from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.pacing import Pacer
from scheduler.core.plan_path import LeverModel
from scheduler.core.slos_serve.spec_length import acceptance
from scheduler.core.speculation_cost import SpecCost

logger = logging.getLogger("sglang_slo.scheduler")

PREFILL_PROBE_TOKENS = 1024  # the per-token prefill cost the router sees is the model's at this chunk


def batch_shape(batch: Any) -> tuple[int, int, int] | None:
    """(prefill tokens, decoding requests, KV tokens attended) of a forward batch: what the perf
    model and the emulated GPU's pacing are keyed on."""
    mode = getattr(batch, "forward_mode", None)
    if mode is None or not batch.reqs:
        return None
    if mode.is_decode():
        return 0, len(batch.reqs), sum(len(r.origin_input_ids) + len(r.output_ids) for r in batch.reqs)
    if mode.is_extend():  # prefill chunks, plus the decodes riding along in a mixed batch
        decoding = {id(r) for r in (getattr(batch, "decoding_reqs", None) or ())}
        prefill = kv = decodes = 0
        for r in batch.reqs:
            if id(r) in decoding:
                decodes += 1
                kv += len(r.origin_input_ids) + len(r.output_ids)
            else:
                prefill += int(r.extend_end - r.prefix_len)  # this step extends [prefix_len, extend_end)
                kv += int(r.extend_end)
        return prefill, decodes, kv
    return None


class EngineMeter:
    """`timing_ok`: a pass's wall time around `run_batch` is its time (CPU, where the forward
    runs synchronously). On a GPU it is the launch only: `gpu_timer` times the pass with CUDA
    events instead, read when its result has been processed (`learn_timed`)."""

    def __init__(
        self, perf: OnlinePerfModel, pacer: Pacer | None, timing_ok: bool, emulated_card: str | None = None
    ) -> None:
        self.perf = perf
        self.pacer = pacer
        self.timing_ok = timing_ok
        self.emulated_card = emulated_card
        self.spec_cost_ratio = 0.0  # draft step / target decode step, for pacing and timing
        self._distortion_logged = -math.inf
        self.gpu_timer: GpuStepTimer | None = None

    def lever_model(self, spec_steps: int, alpha: float | None) -> LeverModel | None:
        """What the default levers are sized with this pass: None until the perf model is trusted;
        under SLO-adaptive speculation, the spec cost at the current length, where a batch may
        last Acc(s) TPOTs and costs its drafts and verify tokens."""
        if not self.perf.ready:
            return None
        if spec_steps > 0 and alpha is not None:
            return LeverModel(
                SpecCost(self.perf, self.spec_cost_ratio).at_steps(spec_steps), acceptance(spec_steps, alpha)
            )
        return LeverModel(self.perf)

    def after_step(
        self,
        shape: tuple[int, int, int],
        spec_steps: int,
        started: float,
        key: Hashable | None = None,
        follows_step: bool = False,
    ) -> None:
        """Pace (emulation) and learn from the pass that began at `started` (perf_counter).
        Emulated: the step goes on the card's timeline under `key`; its results are waited for
        (`wait(key)`) before they are used. `follows_step`: the engine ran a step just before."""
        prefill, decodes, kv = shape
        spec_tokens = decodes * spec_steps  # a speculative decode verifies s drafts per request
        if self.pacer is not None:  # emulated GPU: the step lasts what the profile says
            drafts = SpecCost(self.pacer.model, self.spec_cost_ratio).draft_time(decodes, kv, spec_steps)
            target = self.pacer.target_s(*shape, spec_tokens) + drafts
            if key is None:
                measured = self.pacer.finish(started, target, follows_step)
            else:
                measured = self.pacer.launch(key, started, target, follows_step)
            self._log_distortion()
        elif self.timing_ok:
            measured = time.perf_counter() - started
        else:
            return
        self.learn(shape, spec_steps, measured)

    def learn_timed(self, timed: TimedStep | None) -> None:
        """A pass the GPU timer measured; under emulation the paced time was learned instead."""
        if timed is not None and self.pacer is None:
            self.learn(timed.shape, timed.spec_steps, timed.seconds)

    def learn(self, shape: tuple[int, int, int], spec_steps: int, measured: float) -> None:
        """The target's model learns target work only: the drafts' share is the draft cost's."""
        prefill, decodes, kv = shape
        drafts = SpecCost(self.perf, self.spec_cost_ratio).draft_time(decodes, kv, spec_steps)
        self.perf.observe(prefill, decodes, kv, decodes * spec_steps, max(measured - drafts, 1e-6))

    def card_busy_s(self) -> float:
        """Seconds before a pass planned now starts on the card: the emulated card's queued work.
        (On a real GPU the in-flight step's rest is not known here yet: 0.)"""
        return self.pacer.busy_s() if self.pacer is not None else 0.0

    def wait(self, key: Hashable) -> None:
        """Block until the emulated card has finished the step launched under `key` (a no-op on
        a real engine, or for a step not launched)."""
        if self.pacer is not None:
            self.pacer.wait(key)

    def _log_distortion(self) -> None:
        """Warn (at most every 30 s) when the host cannot keep up with the emulated GPU."""
        pacer, now = self.pacer, time.monotonic()
        assert pacer is not None
        if pacer.steps >= 100 and pacer.late > 0.05 * pacer.steps and now - self._distortion_logged > 30:
            self._distortion_logged = now  # the full report (it sorts the error window) only then
            report = pacer.report()
            logger.warning(
                "emulation of %s distorted: %.1f%% of %d steps late by %.2f ms on average (host too slow)",
                self.emulated_card,
                100 * report.late_share,
                report.steps,
                report.mean_overrun_ms,
            )

    def prefill_ms_per_token(self) -> float:
        return round(1000 * self.perf.step_time(PREFILL_PROBE_TOKENS, 0, 0) / PREFILL_PROBE_TOKENS, 6)

    def decode_step_ms(self, running: int, kv_tokens: int) -> float:
        """The model's step with `running` decodes (at least one) over `kv_tokens` and no prefill."""
        return round(1000 * self.perf.step_time(0, max(1, running), kv_tokens), 6)

    def timing(self) -> str:
        """What the perf model learns from: paced (emulated card), cuda_events, wall, or none."""
        if self.pacer is not None:
            return "paced"
        if self.gpu_timer is not None:
            return "cuda_events"
        return "wall" if self.timing_ok else "none"

    def perf_status(self) -> dict[str, Any]:
        return {
            "ready": self.perf.ready,
            "timing": self.timing(),
            "observed_iterations": self.perf.observed,
            "recent_rel_error": self.perf.recent_error(),
            "predicted_decode_ms": {str(n): round(1000 * self.perf.step_time(0, n, 128 * n), 3) for n in (1, 8, 32)},
        }
