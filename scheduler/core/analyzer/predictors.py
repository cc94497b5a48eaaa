"""Predictor registry: adding a length predictor is one module (its class and parameters
dataclass) plus one line in PREDICTORS. Imported lazily by `base.make_predictor`, so importing
the interface does not load scikit-learn."""

from __future__ import annotations

from scheduler.core.analyzer.base import LengthPredictor
from scheduler.core.analyzer.history import HistoryParams, HistoryPredictor
from scheduler.core.analyzer.moe import MoeParams, MoePredictor
from scheduler.core.analyzer.qrf import QrfParams, QrfPredictor
from scheduler.core.registry import Entry, Registry

# A predictor needs nothing from its host: the context is None (its seed is a parameter).
PREDICTORS: Registry[None, LengthPredictor] = Registry(
    "predictor",
    [
        Entry("qrf", QrfParams, lambda p, ctx: QrfPredictor(p)),
        Entry("moe", MoeParams, lambda p, ctx: MoePredictor(p)),
        Entry("history", HistoryParams, lambda p, ctx: HistoryPredictor(p)),
    ],
)
