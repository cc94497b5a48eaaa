"""A length predictor named on a command line: the same spelling for the engine and the router.

`trained:Q` (the default of both): the Q-quantile of the answer's length given the prompt's length,
from the bundled table trained on a public chat trace, with the recent-answers quantiles standing
by for traffic unlike it (`trained.py`), an upper bound in the spirit of Tempo's and JITServe's QRF
bounds (§4.1); a `.json` path: the same with a table written by benchmarks/predictor/train_length.py;
`history:Q`: the Q-quantile of recent answers' lengths alone, learned online from completions,
no training; `history`: their mean; `history-len:Q` / `history-len`: the same, first among
answers to prompts of about the same length; `none`: no prediction (policies fall back to the client's
max_new_tokens); anything else: a saved analyzer artifact (QRF, MoE).
"""

from __future__ import annotations

import math

from scheduler.core.analyzer.base import LengthPredictor, load_predictor
from scheduler.core.analyzer.online import LiveLengthBounds

DEFAULT_LENGTH_PREDICTOR = "trained:0.9"
HISTORY_KINDS = {"history": False, "history-len": True}  # spelling -> conditions on prompt length
COLD_START = 20  # finished answers the history predictor needs before it predicts


def predictor_from_spec(spec: str | None) -> LengthPredictor | None:
    """A fresh predictor for `spec` (None or "none": no predictor). A bad spec is a ValueError
    naming it; an unreadable artifact raises what loading it raised."""
    if spec is None or spec == "none":
        return None
    kind, sep, quantile = spec.partition(":")
    if kind == "trained" or spec.endswith(".json"):
        from scheduler.core.analyzer.trained import trained_predictor

        try:
            if kind == "trained":
                return trained_predictor(float(quantile) if sep else 0.9)
            return trained_predictor(path=spec)
        except ValueError as e:
            raise ValueError(f"{spec}: {e}") from None
    if kind in HISTORY_KINDS:
        # Here, not at module level: the registry imports every predictor, scikit-learn's too.
        from scheduler.core.analyzer.predictors import make_predictor

        try:
            # No guess before COLD_START answers: the first to finish are the short ones, and a
            # bound learned from them would call long answers short; until then the cap rules.
            return make_predictor(
                "history",
                quantile=float(quantile) if sep else None,
                default=math.inf,
                min_global=COLD_START,
                by_prompt_len=HISTORY_KINDS[kind],
            )
        except ValueError as e:
            raise ValueError(f"{spec}: {e}") from None
    return load_predictor(spec)


def live_length_bounds(spec: str | None) -> LiveLengthBounds | None:
    """Per-request bounds from a fresh predictor for `spec`, as one server keeps them (None: none)."""
    predictor = predictor_from_spec(spec)
    return None if predictor is None else LiveLengthBounds(predictor)
