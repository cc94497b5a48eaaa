"""SGLang flags the adapter cannot honour under an SLO policy are refused at start-up, not left
to bypass the policy quietly."""

from __future__ import annotations

import pytest
from sglang.srt.disaggregation.utils import DisaggregationMode

from scheduler.components.assembly import build_components
from scheduler.config import SloServerConfig
from scheduler.core.clock import ManualClock
from tests.unit.scheduler._stand_in_engine import StandInEngine, StandInSloScheduler


class _IntervalEngine(StandInEngine):
    """SGLang started with --prefill-decode-interval 2: it skips get_new_batch_prefill (where the
    policy plans each pass) for two decode passes after every prefill."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.prefill_decode_interval = 2


class _IntervalSloScheduler(StandInSloScheduler, _IntervalEngine):
    pass


def _start(policy: str) -> StandInSloScheduler:
    components = build_components(SloServerConfig(policy=policy), clock=ManualClock())
    return _IntervalSloScheduler(DisaggregationMode.NULL, 2048, slo_components=components)


def test_prefill_decode_interval_is_refused_under_an_slo_policy() -> None:
    with pytest.raises(ValueError, match="prefill-decode-interval"):
        _start("edf")


def test_prefill_decode_interval_runs_under_fcfs_which_leaves_scheduling_to_sglang() -> None:
    assert _start("fcfs").prefill_decode_interval == 2
