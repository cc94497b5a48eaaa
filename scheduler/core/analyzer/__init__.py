"""Request analyzer: output-length predictors and compound-request pattern matching.

Predictors share one interface (`base.LengthPredictor`) and are built or loaded by name
("qrf", "moe", "history"); `graph` matches partial multi-stage programs to history for
per-stage sub-deadlines. Plain numpy/scikit-learn/quantile-forest: no sglang, no torch.
"""

from scheduler.core.analyzer.base import (
    LengthPredictor,
    LengthSample,
    load_predictor,
    save_predictor,
)

__all__ = ["LengthPredictor", "LengthSample", "load_predictor", "save_predictor"]
