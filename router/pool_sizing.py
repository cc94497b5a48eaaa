"""The prefill:decode split the live mix wants, for the router's status and metrics, with the
pool as it is now (the model: router/pd_sizing.py)."""

from __future__ import annotations

from typing import Any

from router.membership import WorkerRegistry
from router.pd import DECODE, PREFILL
from router.pd_sizing import MixTracker, profile_inputs, split_devices, tracker_sizing
from router.routing_views import WorkerView
from scheduler.core.pacing import SlowedPerfModel


class PoolSizer:
    """Sizes `mix` on the decode workers' GPU profile (loaded once per GPU)."""

    def __init__(self, mix: MixTracker) -> None:
        self.mix = mix
        self._profiles: dict[str, tuple[Any, int | None] | None] = {}

    def _profile(self, gpu: str) -> tuple[Any, int | None] | None:
        if gpu not in self._profiles:
            try:
                self._profiles[gpu] = profile_inputs(gpu)
            except (OSError, ValueError, KeyError):
                self._profiles[gpu] = None
        return self._profiles[gpu]

    def sizing(self, views: list[WorkerView], registry: WorkerRegistry, now: float) -> dict[str, Any] | None:
        """SLOs-Serve App. A's prefill:decode split for the live mix, per TPOT tier, with the pool
        as it is now; sized on the decode workers' GPU profile (None without one)."""
        prefill = [v for v in views if v.role == PREFILL]
        decode = [v for v in views if v.role == DECODE]
        candidates = decode or views
        if not candidates:
            return None
        sized_on = candidates[0]
        profile = self._profile(sized_on.gpu)
        if profile is None:
            return None
        perf, kv_capacity = profile
        reg = registry.registration(sized_on.worker_id)
        scale = 1.0 if reg is None else reg.time_scale
        if scale != 1.0:  # an emulated card in dilated time: so are the clients' TPOTs
            perf = SlowedPerfModel(perf, scale)
        sizing = tracker_sizing(self.mix, now, perf, kv_capacity_tokens=kv_capacity)
        pool = len(prefill) + len(decode) if prefill else len(views)
        sizing["gpu"] = sized_on.gpu
        sizing["time_scale"] = scale
        sizing["pool"] = {
            "prefill_workers": len(prefill),
            "decode_workers": len(decode),
            "co_located_workers": len(views) - len(prefill) - len(decode),
            "split_for_this_pool": split_devices(sizing, pool),
        }
        return sizing
