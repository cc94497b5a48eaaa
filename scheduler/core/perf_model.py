"""Step-time models: how long one forward pass takes, so policies can size batches.

One family behind one protocol, `PerfModel`, and this module is its front door (the members
live in their own modules). Every member derives from `StepTimeModel` (step_time.py), which
answers the inverse questions (the largest decode batch, the largest prefill chunk that fits a
time budget) from the member's own `step_time`, so a member writes only the forward model:

- `RooflinePerfModel` (roofline.py): SLOs-Serve §3.1.1, T = max_l(k1_l·#tokens + k2_l·#spec +
  b_l), fitted by regression. We add a per-term KV coefficient (decode attention reads every KV
  token, which the token count alone misses at long contexts); with k_kv = 0 it is the paper's
  form. Its one-term special cases are `linear_model`, `constant_model` and `default_model`
  (here: the numbers used when no perf model is given).
- `TablePerfModel` (table_perf.py): PolyServe §4.5, a profiled (token batch size, KV tokens) →
  time table, bilinearly interpolated (linearly extrapolated past its edges).
- Elsewhere: `OnlinePerfModel` (learned from measured iterations), `SlowedPerfModel` (an
  emulated card in dilated time), the speculative `AtSteps` (verify plus draft passes).

Roofline and table learn online from measured iterations (`observe`). Profiles are JSON files
(perf_profiles.py) whose format is documented in scheduler/profiles/README.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The family's front door: callers import any member, the protocol and the profile helpers from
# here (`X as X`: re-exported), wherever each is defined.
from scheduler.core.perf_profiles import PROFILE_DIR as PROFILE_DIR
from scheduler.core.perf_profiles import PROFILE_FORMAT as PROFILE_FORMAT
from scheduler.core.perf_profiles import load_profile as load_profile
from scheduler.core.perf_profiles import profile_path as profile_path
from scheduler.core.perf_profiles import save_profile as save_profile
from scheduler.core.roofline import RooflinePerfModel as RooflinePerfModel
from scheduler.core.roofline import RooflineTerm as RooflineTerm
from scheduler.core.step_time import PerfModel as PerfModel
from scheduler.core.step_time import Sample as Sample
from scheduler.core.step_time import StepTimeModel as StepTimeModel
from scheduler.core.step_time import largest_fitting as largest_fitting
from scheduler.core.step_time import prefill_step_times as prefill_step_times
from scheduler.core.table_perf import TablePerfModel as TablePerfModel


@dataclass(frozen=True)
class LinearCoefficients:
    """An affine step time: base + per_token·(prefill + decode + spec tokens) + per_seq·decodes
    + per_kv_token·KV tokens + per_spec_step·draft steps. `per_seq_s` is what a decode costs
    beyond its one token (per-request sampling, attention launches)."""

    base_s: float
    per_token_s: float
    per_seq_s: float = 0.0
    per_kv_token_s: float = 0.0
    per_spec_step_s: float = 0.0

    def model(self) -> RooflinePerfModel:
        term = RooflineTerm(
            k_tokens=self.per_token_s,
            k_spec=self.per_spec_step_s,
            k_kv=self.per_kv_token_s,
            b=self.base_s,
            k_seqs=self.per_seq_s,
        )
        return RooflinePerfModel([term])


# The one set of numbers for "no perf model given": rough figures for a small model on one GPU
# (8 ms per pass, 60 µs per token, 150 µs per decode all told), only so policies can rank
# before anything is measured; replace with a profile or let the online model learn.
DEFAULT_COEFFICIENTS = LinearCoefficients(base_s=0.008, per_token_s=6e-5, per_seq_s=9e-5, per_kv_token_s=2e-8)


def linear_model(
    base_s: float,
    per_token_s: float,
    per_seq_s: float = 0.0,
    per_kv_token_s: float = 0.0,
    per_spec_step_s: float = 0.0,
) -> RooflinePerfModel:
    """The one-term roofline of these coefficients (see `LinearCoefficients`)."""
    return LinearCoefficients(base_s, per_token_s, per_seq_s, per_kv_token_s, per_spec_step_s).model()


def constant_model(step_s: float) -> RooflinePerfModel:
    """Every (non-empty) iteration takes exactly `step_s`: exact arithmetic for constructed schedules."""
    return linear_model(base_s=step_s, per_token_s=0.0)


def default_model() -> RooflinePerfModel:
    """The model for "no perf model given" (`DEFAULT_COEFFICIENTS`), a fresh one each call:
    a model may learn online, so callers must not share it."""
    return DEFAULT_COEFFICIENTS.model()


def load_perf_model(profile: Mapping[str, Any] | str | Path, kind: str = "table") -> RooflinePerfModel | TablePerfModel:
    """A model from a profile file or dict; `kind` is "table" (PolyServe) or "roofline" (SLOs-Serve)."""
    if kind == "table":
        return TablePerfModel.from_profile(profile)
    if kind == "roofline":
        return RooflinePerfModel.from_profile(profile)
    raise ValueError(f"unknown perf model kind {kind!r} (table | roofline)")
