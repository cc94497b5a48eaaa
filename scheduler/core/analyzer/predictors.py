"""Predictor registry: adding a length predictor is one module (its class and parameters
dataclass) plus one line in PREDICTORS. It imports every predictor, scikit-learn's with them:
the interface (`base`) and the command-line spelling (`spec`) do not import it at module level,
so a process that only uses the history predictor never loads scikit-learn."""

from __future__ import annotations

from typing import Any

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


def make_predictor(name: str, **params: Any) -> LengthPredictor:
    """Construct an untrained predictor by name ("qrf", "moe", "history") from plain parameter
    values (a wrong name, parameter or value is a ParamError naming it)."""
    return PREDICTORS.make(name, params, None)


def available() -> list[str]:
    return sorted(PREDICTORS)
