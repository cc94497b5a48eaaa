"""Every perf model stands in for the one PerfModel protocol.

mypy checks this file (pyproject's [tool.mypy] files): each assignment below is a typed proof
that the class implements the whole protocol with compatible signatures. The one private model
(slos_serve's draft-depth wrapper) is proved where it is passed as a PerfModel. At run time the
test only checks that every model answers each method.
"""

from __future__ import annotations

from scheduler.core.online_perf import OnlinePerfModel
from scheduler.core.pacing import SlowedPerfModel
from scheduler.core.perf_model import (
    PerfModel,
    RooflinePerfModel,
    RooflineTerm,
    TablePerfModel,
    constant_model,
    default_model,
    linear_model,
)
from scheduler.core.speculation_cost import SpecCost


def every_model() -> dict[str, PerfModel]:
    roofline: PerfModel = RooflinePerfModel([RooflineTerm(k_tokens=2e-5, k_spec=1e-4, k_kv=1e-8, b=5e-3)])
    table: PerfModel = TablePerfModel([1, 64, 256], [0, 100_000], [[0.005, 0.007], [0.006, 0.009], [0.01, 0.02]])
    online: PerfModel = OnlinePerfModel(prior=roofline)
    learning: PerfModel = OnlinePerfModel()
    slowed: PerfModel = SlowedPerfModel(roofline, 2.0)
    at_steps: PerfModel = SpecCost(roofline, 0.25).at_steps(3)
    linear: PerfModel = linear_model(base_s=0.004, per_token_s=3e-5)
    constant: PerfModel = constant_model(0.015)
    default: PerfModel = default_model()
    return {
        "roofline": roofline,
        "table": table,
        "online": online,
        "learning": learning,
        "slowed": slowed,
        "at_steps": at_steps,
        "linear": linear,
        "constant": constant,
        "default": default,
    }


def test_every_model_answers_the_whole_protocol() -> None:
    for name, model in every_model().items():
        assert model.step_time(128, 4, 4000) > 0.0, name
        assert model.max_batch_within(0.05, 1000.0) >= 0, name
        assert model.max_chunk_within(0.05, 4, 4000, 4096) >= 0, name
