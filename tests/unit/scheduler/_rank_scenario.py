"""Two TP ranks whose own decisions would differ: the leading rank's clock has passed a queued
request's max_queue_ms and its perf model is trusted (so the TPOT lever lowers the chunk); the
other rank's clock stands at the requests' arrival and its model is not ready. Run alone, they
would drop different requests and run different chunks: the forward's collectives would mismatch.

Also run as `python -m tests.unit.scheduler._rank_scenario RANK PORT` by the gloo test: one rank
of a two-process gloo group synchronised by the adapter's own broadcast, printing its outcome."""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace
from typing import Any

from sglang.srt.disaggregation.utils import DisaggregationMode

from scheduler.core.perf_model import RooflinePerfModel, RooflineTerm
from tests.unit.scheduler._stand_in_engine import StandInReq, StandInSloScheduler, slo_scheduler

PERF = RooflinePerfModel([RooflineTerm(k_tokens=1e-3, k_spec=0.0, k_kv=0.0, b=0.01)])  # 10 ms + 1 ms/token
STARTUP_CHUNK = 2048


def rank_scheduler(leader: bool) -> StandInSloScheduler:
    s = slo_scheduler(DisaggregationMode.NULL, startup_chunk=STARTUP_CHUNK, mixed=True, perf=PERF if leader else None)
    running = []
    for i in range(3):
        req = StandInReq(f"run{i}", 100, ttft_ms=1_000, tpot_ms=15)
        req.output_ids = [1]
        running.append(req)
    s.running_batch = SimpleNamespace(reqs=running, batch_is_full=False)
    late = StandInReq("late", 100, ttft_ms=1_000)
    late.sampling_params.custom_params["slo"]["max_queue_ms"] = 500.0
    s.waiting_queue = [StandInReq("w", 100, ttft_ms=60_000, tpot_ms=15), late]
    if leader:
        s.slo.clock.set(1.0)  # 'late' arrived at 0.0: past its max_queue_ms here only
    return s


def outcome(s: StandInSloScheduler) -> dict[str, Any]:
    """What the pass decided, as the engine saw it."""
    return {
        "dropped": sorted(out.rid for out in s.sent),
        "waiting": [r.rid for r in s.waiting_queue],
        "chunk": s.chunked_prefill_size,
        "batch_cap": s.slo.pass_state.applied.batch_cap,
        "prefill_open": s.slo.pass_state.applied.prefill_open,
        "passes": [list(p) for p in s.seen_passes],
        "shared": s.slo.sync.shared,
    }


def _run_rank(rank: int, port: int) -> None:
    import torch.distributed as dist

    from scheduler.sglang_engine import pass_sync

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    s = rank_scheduler(leader=rank == 0)
    s.dp_tp_group = SimpleNamespace(world_size=2, rank=rank, ranks=[0, 1])  # SGLang's GroupCoordinator fields
    s.dp_tp_cpu_group = dist.group.WORLD
    s.slo.sync = pass_sync(s)
    s.get_new_batch_prefill(s.running_batch)
    s.get_new_batch_prefill(s.running_batch)  # a second pass: the calls stay paired
    print("OUTCOME " + json.dumps(outcome(s)), flush=True)
    dist.barrier()  # neither rank tears the group down while the other still uses it
    dist.destroy_process_group()
    # gloo's threads can outlive the group into interpreter teardown, where one aborted a rank
    # that had finished its work ("terminate called without an active exception" in CI)
    os._exit(0)


if __name__ == "__main__":
    _run_rank(int(sys.argv[1]), int(sys.argv[2]))
