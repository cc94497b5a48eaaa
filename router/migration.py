"""Moving running requests between workers: the policy's periodic choices and an operator's.

A move aborts the request on its source and resumes it on the target from the tokens delivered
(router/resume.py); the release and the new assignment happen in one synchronous step, so the
source's late chunks no longer count. A request whose output cannot be carried over
(router/handover.py) is pinned: kept off the policy's checks and refused to an operator.
"""

from __future__ import annotations

from router.dispatch_handle import DispatchHandle, DispatchPart
from router.flight import Flight
from router.flight_table import FlightTable
from router.handover import MigrationRefused, migration_blocker
from router.pd import DECODE, PREFILL
from router.placement import Placement
from router.protocol import Abort
from router.resume import cap_reached, resume_route
from router.routing_views import RunningView


class Migrator(DispatchPart):
    """Executes the policy's migrations (`tick`) and an operator's (`migrate`); `can_decode`: the
    router has a detokenizer, so stop strings can be matched across a move."""

    def __init__(self, handle: DispatchHandle, table: FlightTable, placement: Placement, can_decode: bool) -> None:
        super().__init__(handle)
        self.table = table
        self.placement = placement
        self.can_decode = can_decode

    async def tick(self) -> None:
        """Ask the policy which running requests to move, and move them."""
        now = self.clock()
        running = [
            RunningView(f.route, f.owner, len(f.delivered), f.first_token_s)
            for f in self.table.flights.values()
            if f.owner is not None and not f.done and self._movable(f)
        ]
        moves = self.policy.migrations(running, self.placement.pairing.policy_views(now, None)[0], now)
        for rid, target in moves:
            await self._migrate(rid, target)

    def _movable(self, flight: Flight) -> bool:
        """Whether the policy may move it: its output can be carried over (router/handover.py)."""
        if self._blocker(flight) is None:
            return True
        if not flight.pinned:
            flight.pinned = True
            self.counters["migrations_pinned"] += 1
        return False

    def _blocker(self, flight: Flight) -> str | None:
        return migration_blocker(flight.submit.sampling_params, len(flight.delivered), self.can_decode)

    async def migrate(self, rid: str, target: str) -> bool:
        """Move a running request to `target` now (operator hook); False when it was skipped,
        MigrationRefused when its output cannot be carried over."""
        flight = self.table.flights.get(rid)
        why = None if flight is None else self._blocker(flight)
        if why is not None:
            self.counters["migrations_refused"] += 1
            raise MigrationRefused(f"request {rid!r} cannot be migrated: {why}")
        before = self.counters["migrated"]
        await self._migrate(rid, target)
        return self.counters["migrated"] > before

    async def _migrate(self, rid: str, target: str) -> None:
        """Abort on the source, resume on the target; the source's late chunks no longer count."""
        flight = self.table.flights.get(rid)
        source = None if flight is None else flight.owner
        if flight is None or source is None or source == target or not self.registry.is_alive(target):
            self.counters["migrations_skipped"] += 1
            return
        if cap_reached(flight.submit, len(flight.delivered)) or self._blocker(flight) is not None:
            self.counters["migrations_skipped"] += 1  # nothing left to generate, or it cannot move
            return
        prefill = None
        role = next((v.role for v in self.registry.views(self.clock()) if v.worker_id == target), None)
        if role == PREFILL:
            self.counters["migrations_skipped"] += 1
            return
        if role == DECODE:  # the resumed prompt needs a prefill partner of its own
            route = resume_route(flight.route, len(flight.delivered))
            _, prefill = self.placement.pairing.policy_views(self.clock(), route)
            if prefill is None:
                self.counters["migrations_skipped"] += 1
                return
        self.table.release(flight)
        msg = self.placement.assign(flight, target, prefill)  # same synchronous step as the release
        self.policy.on_routed(flight.route, target)
        self.counters["migrated"] += 1
        sent = await self.outbox.send(target, msg)
        if sent and prefill is not None and flight.prefill == prefill:
            await self.table.flush_aborts(flight)  # an old partner's Abort must not follow this Submit
            sent = await self.outbox.send(prefill, msg)
        await self.outbox.send(source, Abort(rid=rid))
        if flight.stale:
            await self.table.flush_aborts(flight)
        if not sent and flight.owner == target and not flight.done:
            self.table.release(flight)
            flight.stale.append(target)
            await self.placement.resubmit(flight, target, f"migration target {target} unreachable")
