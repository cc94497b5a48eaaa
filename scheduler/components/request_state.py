"""What the adapter keeps per request, in one object per rid (never on SGLang's own objects).

A request's SLO and arrival are read once from the `custom_params` the HTTP edge injected; the
benchmark-only true length (the hidden hint) and the client cap it lowered are kept here too,
as is the tier the policy's last plan put the request in while it waited (the tier it starts
in is the one it runs in): one set of rids, so a pass touches only the requests whose tier
changed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

import numpy as np

from scheduler.core.position_rids import PositionRids
from scheduler.core.slo import SloSpec, SloValidationError
from scheduler.core.slo_wire import read_injected
from wire import ARRIVAL_PARAM, ORACLE_HINT_PARAM, SHARE_PARAM, TENANT_PARAM

logger = logging.getLogger("sglang_slo.scheduler")

_UNSET = object()


@dataclass
class RequestState:
    slo: SloSpec
    arrival: float  # unix time, the same domain as the scheduler's clock
    hinted: bool = False  # a benchmark's hidden true length lowered the engine's max_new_tokens
    client_cap: int | None = None  # ... and this was the client's own (what policies see)
    stage_deadline: Any = _UNSET  # compound: D_s fixed when the stage is first seen (float | None)
    tenant: str | None = None  # the caller's key name, as the HTTP edge wrote it (fair shares)
    share: float = 1.0  # that key's share

    @property
    def stage_deadline_known(self) -> bool:
        return self.stage_deadline is not _UNSET


def oracle_hint(sampling_params: Any) -> int | None:
    """The true output length a benchmark attached (a positive int), else None."""
    value = (getattr(sampling_params, "custom_params", None) or {}).get(ORACLE_HINT_PARAM)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def injected_arrival(sampling_params: Any) -> float | None:
    """The arrival the HTTP edge stamped (unix time), without parsing the SLO."""
    value = (getattr(sampling_params, "custom_params", None) or {}).get(ARRIVAL_PARAM)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def request_tenant(sampling_params: Any) -> tuple[str | None, float]:
    """The tenant and share the HTTP edge wrote from the caller's key (a client's own `slo_*`
    keys were stripped there); no tenant, share 1 when absent or malformed."""
    custom = getattr(sampling_params, "custom_params", None) or {}
    tenant, share = custom.get(TENANT_PARAM), custom.get(SHARE_PARAM, 1.0)
    if not isinstance(tenant, str) or not tenant:
        return None, 1.0
    ok = isinstance(share, (int, float)) and not isinstance(share, bool) and 0 < share < float("inf")
    return tenant, float(share) if ok else 1.0


def request_slo(rid: str, sampling_params: Any) -> tuple[SloSpec, float | None]:
    """The SLO and arrival the HTTP layer attached; best-effort if absent or unreadable."""
    try:  # decoded, not re-validated: this scheduler's HTTP process validated what it injected
        injected = read_injected(getattr(sampling_params, "custom_params", None), validated=True)
    except (SloValidationError, KeyError, TypeError, ValueError):
        logger.warning("request %s carried an invalid SLO; treating it as best-effort", rid)
        injected = None
    return injected if injected is not None else (SloSpec(), None)


class RequestStates:
    """rid -> RequestState for every request the scheduler has seen and not yet finished."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}
        self._caps: dict[str, int | None] = {}  # set at arrival, before a state exists
        self._declined: set[str] = set()  # known rids the last plan put in the best-effort tier
        self._declined_be: set[str] = set()  # those of class best effort (their views cannot tell)
        self._tier_changed: set[str] = set()  # rids in or out of `_declined` since `take_tier_changes`

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, rid: str) -> bool:
        return rid in self._states

    def of(self, req: Any, now: float) -> RequestState:
        """The state of SGLang request `req` (reads rid and sampling_params), created on first sight."""
        state = self._states.get(req.rid)
        if state is None:
            spec, arrival = request_slo(req.rid, req.sampling_params)
            tenant, share = request_tenant(req.sampling_params)
            state = RequestState(spec, arrival if arrival is not None else now, tenant=tenant, share=share)
            if req.rid in self._caps:
                state.hinted, state.client_cap = True, self._caps.pop(req.rid)
            self._states[req.rid] = state
        return state

    def get(self, rid: str) -> RequestState | None:
        return self._states.get(rid)

    def lower_cap_to_hint(self, rid: str, sampling_params: Any) -> None:
        """A benchmark's hidden true length ends the request there, like the model's EOS would;
        the client's own cap is remembered for the policy's view."""
        hint = oracle_hint(sampling_params)
        if hint is None:
            return
        cap = sampling_params.max_new_tokens
        self._caps[rid] = cap
        sampling_params.max_new_tokens = hint if cap is None else min(cap, hint)
        sampling_params.ignore_eos = True

    def hinted(self, rid: str) -> bool:
        """Whether the hidden hint lowered this request's engine cap."""
        state = self._states.get(rid)
        return rid in self._caps or (state is not None and state.hinted)

    def mark_tier(self, waiting: Iterable[str], tier: AbstractSet[str]) -> None:
        """The known requests among `waiting` are in the best-effort tier iff in `tier`; the
        others keep theirs (a running request stays in the tier it started in). Costs what
        changed since the last plan, plus one pass over the tier."""
        declined = self._declined
        if (not tier and not declined) or tier == declined:  # equal sizes first: a cheap miss
            return
        tier = tier.rids() if isinstance(tier, PositionRids) else tier
        left, joined = declined - tier, tier - declined
        if not (left or joined):
            return
        queued = waiting if isinstance(waiting, AbstractSet) else set(waiting)
        gone, came = left & queued, (joined & queued) & self._states.keys()
        for rid in gone:
            self._set_tier(rid, False)
        for rid in came:
            self._set_tier(rid, True)

    def mark_tier_at(
        self, waiting: Sequence[str], tier_at: np.ndarray, flips_at: np.ndarray, best_effort_at: np.ndarray
    ) -> None:
        """`mark_tier` with the tier as positions in `waiting`, for a plan that found where the
        tier changes (FinalPlan.tier_flips_at): a pass where few requests change tier costs a
        few, not a set of the tier. Requests of class best effort (`best_effort_at`) are in the
        tier in their views either way, so they are looked up here, only while any of them is
        or joins it."""
        in_tier = np.zeros(len(waiting), dtype=bool)
        in_tier[tier_at] = True
        at = waiting.__getitem__
        # Set operations in C, not a call per request: a policy's order can move hundreds of
        # requests into the tier and out again on consecutive passes.
        joining = set(map(at, flips_at[in_tier[flips_at]].tolist()))
        leaving = set(map(at, flips_at[~in_tier[flips_at]].tolist()))
        joining_be: set[str] = set()
        if len(best_effort_at) and (self._declined_be or in_tier[best_effort_at].any()):
            be_in = in_tier[best_effort_at]
            joining_be = set(map(at, best_effort_at[be_in].tolist()))
            joining |= joining_be
            leaving.update(map(at, best_effort_at[~be_in].tolist()))
        joining = (joining & self._states.keys()) - self._declined  # known, and not in the tier yet
        leaving &= self._declined
        if joining or leaving:
            self._declined |= joining
            self._declined -= leaving
            self._declined_be |= joining & joining_be
            self._declined_be -= leaving
            self._tier_changed |= joining
            self._tier_changed |= leaving

    def _set_tier(self, rid: str, declined: bool) -> None:
        if declined == (rid in self._declined):
            return
        self._tier_changed.add(rid)
        if declined:
            self._declined.add(rid)
            if self._states[rid].slo.is_best_effort:
                self._declined_be.add(rid)
        else:
            self._declined.discard(rid)
            self._declined_be.discard(rid)

    def take_tier_changes(self) -> set[str]:
        """The rids whose tier changed since the last call: what a view builder refreshes,
        instead of asking every waiting request every pass."""
        changed, self._tier_changed = self._tier_changed, set()
        return changed

    @property
    def declined(self) -> AbstractSet[str]:
        """The known rids in the best-effort tier (read-only: `mark_tier` sets it)."""
        return self._declined

    def is_declined(self, rid: str) -> bool:
        return rid in self._declined

    def forget(self, rid: str) -> RequestState | None:
        self._caps.pop(rid, None)
        if rid in self._declined:
            self._declined.discard(rid)
            self._declined_be.discard(rid)
            self._tier_changed.add(rid)
        return self._states.pop(rid, None)

    def keep_only(self, live: set[str]) -> None:
        """Drop the states of requests that left without passing through `forget` (aborts)."""
        self._states = {rid: s for rid, s in self._states.items() if rid in live}
        self._caps = {rid: c for rid, c in self._caps.items() if rid in live}
        self._declined &= live
        self._declined_be &= live
