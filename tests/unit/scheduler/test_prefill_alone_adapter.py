"""The adapter runs a plan's `prefill_alone` pass through SGLang's own admission with mixing off
for that pass only (the decodes wait it out), and counts it."""

from __future__ import annotations

from scheduler.config import SloServerConfig
from scheduler.core.perf_model import linear_model
from tests.unit.scheduler._stand_in_engine import StandInReq, slo_scheduler
from wire import TOKEN_TS_KEY

PERF = linear_model(base_s=0.005, per_token_s=1e-4, per_seq_s=0.004)


def _pass(prefill_alone: bool, tpot_ms: float) -> tuple[list[bool], int, bool]:
    """One pass of `slos` with three streams decoding at `tpot_ms` and a short prompt waiting for
    its first token: (is_mixed_chunk as SGLang's admission saw it, the prefill_alone counter,
    is_mixed_chunk after the pass)."""
    config = SloServerConfig(policy="slos", policy_params={"prefill_alone": prefill_alone})
    s = slo_scheduler(startup_chunk=2048, mixed=True, perf=PERF, config=config)
    s.slo.clock.set(1.0)
    streams = [StandInReq(f"s{i}", prompt=20, ttft_ms=500.0, tpot_ms=tpot_ms, max_new_tokens=64) for i in range(3)]
    for r in streams:  # three tokens by 1.0 s, the first stamped at 0.4 s: the next is due at 0.5 + 3 x TPOT
        r.output_ids = [1] * 3
        r.customized_info = {TOKEN_TS_KEY: [0.4, 0.6, 0.8]}
    s.running_batch.reqs = streams
    s.waiting_queue = [StandInReq("new", prompt=200, ttft_ms=100.0, arrival=1.0)]
    out = s.get_new_batch_prefill(s.running_batch)
    assert out.batch_to_run is not None and [r.rid for r in out.batch_to_run.reqs] == ["new"]
    return s.mixed_seen, s.slo.counters.prefill_alone, s.is_mixed_chunk


def test_a_prefill_alone_pass_admits_with_mixing_off_and_restores_it() -> None:
    seen, counted, after = _pass(prefill_alone=True, tpot_ms=1000.0)
    assert seen == [False] and counted == 1 and after is True


def test_without_slack_or_without_the_parameter_the_pass_stays_mixed() -> None:
    for alone, tpot_ms in ((False, 1000.0), (True, 170.0)):  # 170 ms: the next token due in 10 ms
        seen, counted, after = _pass(prefill_alone=alone, tpot_ms=tpot_ms)
        assert seen == [True] and counted == 0 and after is True, (alone, tpot_ms)
