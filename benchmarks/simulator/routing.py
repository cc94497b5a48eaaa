"""The router's side of a simulated cluster: the live router's policy objects on simulated views.

What the live router does per request (router/service.py, router/dispatcher.py) is done here
with the same objects: the length predictor (`make_length_predictor`, history:0.9 by default)
gives `predicted_output_tokens`; in a PD pool the `PrefillChooser` picks the prefill worker and
the policy sees `decode_side_views`; the policy's `choose` picks the owner; `on_finished`,
`on_routed` and `migrations` are called where the dispatcher calls them, every
`migrate_interval_s`. Views are the workers' last reports with the router's in-flight counts
(`load_report_to_view`), refreshed only for workers whose report or in-flight count changed
since the last decision: at 512 workers rebuilding all of them per decision is what would cost,
not the policy.

The time a decision takes (views, PD partner, choose) is measured with perf_counter_ns around
exactly the work the dispatcher's `_choose` times.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from benchmarks.simulator.worker import SimWorker
from router.pd import DECODE, PREFILL, SPREAD, PrefillChooser, decode_side_views, is_pd_pool
from router.policies import NoWorkerError, RoutingContext, RoutingPolicy, make_routing_policy
from router.protocol import LoadReport
from router.resume import resume_route
from router.routing_views import Decision, RouteRequest, RunningView, WorkerView
from router.service import make_length_predictor


@dataclass(eq=False)
class Flight:
    """One client request across the workers it ran on."""

    route: RouteRequest
    owner: str | None = None
    prefill: str | None = None  # PD partner of the current placement
    hop: int = 0  # placements so far; a stale hand-off (an older hop's) is ignored
    prior_tokens: list[float] = field(default_factory=list)  # delivered by earlier hops
    first_token_s: float | None = None
    done: bool = False
    migrations: int = 0


class _Running(Sequence[RunningView]):
    """The dispatcher's running list, built only if the policy reads it (GoodServe reads it once
    every tau ticks): RunningViews of every placed flight, in placement order."""

    def __init__(self, router: SimRouter) -> None:
        self._router = router
        self._items: list[RunningView] | None = None

    def _built(self) -> list[RunningView]:
        if self._items is None:
            r = self._router
            self._items = [
                RunningView(f.route, f.owner, r.delivered(f), f.first_token_s)
                for f in r.flights.values()
                if f.owner is not None and not f.done
            ]
        return self._items

    def __len__(self) -> int:
        return len(self._built())

    def __getitem__(self, i: Any) -> Any:
        return self._built()[i]

    def __iter__(self) -> Iterator[RunningView]:
        return iter(self._built())


class SimRouter:
    def __init__(
        self,
        policy: str,
        params: dict[str, Any],
        workers: Sequence[SimWorker],
        clock: Callable[[], float],
        length_predictor: str | None = "history:0.9",
        delivered: Callable[[Flight], int] | None = None,
        make_policy: Callable[[RoutingContext], RoutingPolicy] | None = None,
        prefill_placement: str = SPREAD,
    ) -> None:
        self.clock = clock
        self.workers = {w.worker_id: w for w in workers}
        self.order = [w.worker_id for w in workers]
        self.flights: dict[str, Flight] = {}
        self.inflight: dict[str, dict[str, Flight]] = {w.worker_id: {} for w in workers}
        self.views: list[WorkerView] = [w.view for w in workers]
        self._index = {w.worker_id: i for i, w in enumerate(workers)}
        self._reports: dict[str, tuple[LoadReport, float]] = {}  # worker -> (last report, when it came)
        self._dirty: set[str] = set()
        self.pd = is_pd_pool(self.views)
        self.prefill_chooser = PrefillChooser(prefill_placement)
        context = RoutingContext(running_on=self.running_on, clock=clock)
        if make_policy is not None:
            self.policy = make_policy(context)
        else:
            self.policy = make_routing_policy(policy, context, **params)
        self.predictor = make_length_predictor(length_predictor)
        self.delivered = delivered if delivered is not None else (lambda f: len(f.prior_tokens))
        self.decision_ns: list[int] = []
        self.counters: dict[str, int] = {"decisions": 0, "migrated": 0, "migrations_skipped": 0, "no_worker": 0}

    # ---- views -------------------------------------------------------------------------------
    def on_report(self, worker_id: str, report: LoadReport) -> None:
        self._reports[worker_id] = (report, self.clock())
        self._dirty.add(worker_id)

    def current_views(self) -> list[WorkerView]:
        """The registry's views now: each worker's last report with the router's in-flight count."""
        for wid in self._dirty:
            i, inflight = self._index[wid], len(self.inflight[wid])
            last = self._reports.get(wid)
            if last is None:
                self.views[i] = replace(self.views[i], inflight=inflight)
            else:
                self.views[i] = self.workers[wid].view_from(last[0], inflight, last[1])
        self._dirty.clear()
        return self.views

    def running_on(self, worker_id: str) -> list[RunningView]:
        """What the dispatcher's running_on answers (SLOs-Serve's replica state)."""
        return [
            RunningView(f.route, worker_id, self.delivered(f), f.first_token_s)
            for f in self.inflight.get(worker_id, {}).values()
            if not f.done
        ]

    # ---- placement ---------------------------------------------------------------------------
    def route_request(
        self, rid: str, prompt: int, slo: Any, arrival: float, max_new: int | None, prefix_hashes: tuple[int, ...] = ()
    ) -> RouteRequest:
        predicted = None
        if self.predictor is not None:
            value = self.predictor.predict("", prompt, slo.program_id)
            if value == value and value != float("inf"):
                predicted = max(1, min(int(-(-value // 1)), max_new if max_new is not None else 1 << 62))
        return RouteRequest(
            rid=rid,
            prompt_tokens=prompt,
            slo=slo,
            arrival_s=arrival,
            prefix_hashes=prefix_hashes,
            predicted_output_tokens=predicted,
            max_new_tokens=max_new,
        )

    def choose(self, flight: Flight) -> tuple[Decision, str | None] | None:
        """(decision, PD prefill partner) for the flight as it stands (a resume after migration
        sees the longer prompt), or None when no worker is left."""
        now = self.clock()
        t0 = time.perf_counter_ns()
        route = resume_route(flight.route, self.delivered(flight))
        try:
            views = self.current_views()
            prefill = None
            if self.pd:
                choice = self.prefill_chooser.choose(route, [v for v in views if v.role == PREFILL], now)
                prefill = None if choice is None else choice.worker_id
                views = decode_side_views(views, choice)
            decision = self.policy.choose(route, views, now)
        except NoWorkerError:
            self.counters["no_worker"] += 1
            return None
        finally:
            self.decision_ns.append(time.perf_counter_ns() - t0)
            self.counters["decisions"] += 1
        why = f"reason:{decision.reason}"  # why it went there (e.g. GoodServe's best effort)
        self.counters[why] = self.counters.get(why, 0) + 1
        role = self.workers[decision.worker_id].role
        return decision, prefill if role == DECODE else None

    def choose_prefill(self, flight: Flight, delivered: int) -> str | None:
        """A prefill partner for the flight resumed after `delivered` tokens (a migration onto
        a decode worker), as the dispatcher asks its PrefillChooser."""
        route = resume_route(flight.route, delivered)
        prefill_views = [v for v in self.current_views() if v.role == PREFILL]
        choice = self.prefill_chooser.choose(route, prefill_views, self.clock())
        return None if choice is None else choice.worker_id

    def assign(self, flight: Flight, owner: str, prefill: str | None, prompt_tokens: int) -> None:
        flight.owner, flight.prefill = owner, prefill
        flight.hop += 1
        self.inflight[owner][flight.route.rid] = flight
        self._dirty.add(owner)
        if prefill is not None:
            self.prefill_chooser.on_routed(flight.route.rid, prefill, prompt_tokens)

    def release(self, flight: Flight) -> str | None:
        """Detach the flight from its owner and prefill partner (finished, failed, migrating)."""
        owner, flight.owner = flight.owner, None
        if owner is not None:
            self.inflight[owner].pop(flight.route.rid, None)
            self._dirty.add(owner)
            self.policy.on_finished(flight.route.rid, owner)
        self.prefill_done(flight)
        return owner

    def prefill_done(self, flight: Flight) -> None:
        if flight.prefill is not None:
            self.prefill_chooser.on_done(flight.route.rid)
            flight.prefill = None

    def finished(self, flight: Flight, completion_tokens: int) -> None:
        flight.done = True
        self.release(flight)
        self.flights.pop(flight.route.rid, None)
        if self.predictor is not None and hasattr(self.predictor, "observe"):
            self.predictor.observe(flight.route.slo.program_id, completion_tokens, flight.route.prompt_tokens)

    # ---- migration ---------------------------------------------------------------------------
    def migrations(self) -> list[tuple[str, str]]:
        views = self.current_views()
        if self.pd:
            views = [v for v in views if v.role != PREFILL]
        return self.policy.migrations(_Running(self), views, self.clock())
