"""PD pairing in the dispatcher: which workers the routing policy sees, the prefill partner a
placement implies, and the bookkeeping of a pair while its prefill half runs.

A pair shares one Submit with a fresh bootstrap room: the prefill worker hands its KV to the
decode worker through SGLang's transfer engine, and only the decode half's chunks reach the
client. The choice of the prefill worker is router/pd.py's.
"""

from __future__ import annotations

from dataclasses import replace

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import Flight
from router.pd import PREFILL, SPREAD, PrefillChooser, bootstrap_for, decode_side_views, is_pd_pool
from router.protocol import Submit
from router.routing_views import RouteRequest, WorkerView


class PdPairing(DispatchPart):
    """Chooses the prefill partner of a placement and tracks the prompt tokens sent to each."""

    def __init__(self, handle: DispatchHandle, placement: str = SPREAD) -> None:
        super().__init__(handle)
        self.chooser = PrefillChooser(placement)

    def policy_views(
        self, now: float, route: RouteRequest | None, exclude: set[str] | frozenset[str] = frozenset()
    ) -> tuple[list[WorkerView], str | None]:
        """The workers the routing policy chooses among, and (PD) the prefill partner it implies.

        `exclude`d workers are shown unhealthy. Without prefill workers these are all workers. In
        a PD pool the prefill worker is chosen first (PolyServe §4.7) and the policy sees decode
        and co-located workers only; with no `route` (migration checks) no partner is chosen.
        """
        views = [replace(v, healthy=False) if v.worker_id in exclude else v for v in self.registry.views(now)]
        if not is_pd_pool(views):
            return views, None
        if route is None:
            return [v for v in views if v.role != PREFILL], None
        choice = self.chooser.choose(route, [v for v in views if v.role == PREFILL], now)
        return decode_side_views(views, choice), None if choice is None else choice.worker_id

    def pair(self, flight: Flight, msg: Submit, prefill: str) -> Submit:
        """`msg` with a fresh bootstrap room on `prefill`, which becomes the flight's partner."""
        reg = self.registry.registration(prefill)
        assert reg is not None and reg.bootstrap_port is not None
        msg = replace(msg, bootstrap=bootstrap_for(reg.http_url, reg.bootstrap_port))
        flight.prefill = prefill
        flight.prefill_hops.append(prefill)
        self.chooser.on_routed(flight.route.rid, prefill, len(msg.input_ids) + len(msg.resume_output_ids))
        self.routed[prefill] += 1
        self.counters["pd_pairs"] += 1
        return msg

    def drop(self, flight: Flight, abort: bool) -> None:
        """End the flight's pair; with `abort` its prefill worker is owed an Abort."""
        prefill, flight.prefill = flight.prefill, None
        if prefill is None:
            return
        self.chooser.on_done(flight.route.rid)
        if abort:
            flight.stale.append(prefill)
