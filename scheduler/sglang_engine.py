"""Reads of SGLang 0.5.23 scheduler and request state that the adapter's mixins share: the PD
role, a request's uncached tokens, the ranks that must agree each pass, this process's parallel
ranks and the CUDA step timer. Only the adapter modules (scheduler/sglang_*.py) import it."""

from __future__ import annotations

from typing import Any

from scheduler.components.rank_sync import PassSync
from scheduler.components.step_timer import GpuStepTimer
from scheduler.core.plan_path import DECODE, MIXED, PREFILL


def disagg_role(scheduler: Any) -> str:
    """SGLang's DisaggregationMode as a plan role: mixed (co-located), prefill or decode."""
    mode = getattr(scheduler, "disaggregation_mode", None)
    value = str(getattr(mode, "value", mode or "null"))
    return value if value in (PREFILL, DECODE) else MIXED


def cached_prefix_len(req: Any) -> int:
    """Tokens of `req` already in the KV cache: SGLang's `Req.prefix_len` (the last prefix
    match for a waiting request, which SGLang re-matches on admission)."""
    return int(req.prefix_len)


def uncached_len(req: Any) -> int:
    """Tokens still to prefill: prompt (+ output, after a retraction) past the cached prefix."""
    return len(req.origin_input_ids) + len(req.output_ids) - cached_prefix_len(req)


def pass_sync(scheduler: Any) -> PassSync:
    """The ranks that must agree each pass, as SGLang broadcasts their requests: its dp_tp group
    (the attention-TP group under DP attention, else the TP group), then the attention-CP group;
    the leader is the first rank of both."""
    stages = []
    for name in ("dp_tp_group", "attn_cp_group"):
        group = getattr(scheduler, name, None)
        if group is not None and group.world_size > 1:
            stages.append((group, getattr(scheduler, name.replace("_group", "_cpu_group"))))
    if not stages:
        return PassSync()
    from sglang.srt.utils import broadcast_pyobj

    def broadcast(value: Any) -> Any:
        for group, cpu_group in stages:
            value = broadcast_pyobj([value], group.rank, cpu_group, src=group.ranks[0])[0]
        return value

    return PassSync(broadcast, leader=all(group.rank == group.ranks[0] for group, _ in stages))


def pipeline_rank() -> int:
    """This scheduler's pipeline stage (SGLang's runtime context; 0 without pipelining)."""
    from sglang.srt.runtime_context import get_parallel

    return int(get_parallel().pp_rank or 0)


def dp_index() -> int:
    """This scheduler's data-parallel replica: the attention-DP rank under DP attention, else
    SGLang's dp_rank (None without data parallelism)."""
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    if parallel.attn_dp_enabled:
        return int(parallel.attn_dp_rank or 0)
    return int(parallel.dp_rank or 0)


def cuda_step_timer(scheduler: Any) -> GpuStepTimer:
    """CUDA events on the stream the forward runs on: SGLang's forward stream under overlap
    scheduling (made to wait for the scheduling stream's inputs first, as run_batch does), else
    the scheduling loop's current stream."""
    import torch

    def new_event() -> Any:
        return torch.cuda.Event(enable_timing=True)

    if scheduler.enable_overlap:
        forward = scheduler.forward_stream
        return GpuStepTimer(
            new_event, lambda: forward, before_start=lambda: forward.wait_stream(torch.cuda.current_stream())
        )
    return GpuStepTimer(new_event, torch.cuda.current_stream)


def running_requests(scheduler: Any) -> int:
    """Running requests, with the decodes a mixed step carries: SGLang moves them out of
    running_batch into the batch it runs until the step's results are merged back."""
    running, current = scheduler.running_batch, getattr(scheduler, "cur_batch_for_debug", None)
    mixed = current is not None and current is not running and current.forward_mode.is_extend()
    return len(running.reqs) + (len(current.decoding_reqs or ()) if mixed else 0)
