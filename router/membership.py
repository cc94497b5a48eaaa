"""Router-side worker membership: who is registered, who is alive, what each last reported and
which requests the router has in flight where.

Pure bookkeeping with the clock passed in (`now`), so liveness and failover are unit-testable
without sockets or sleeps. The router feeds it every worker message and calls `reap` on a timer.

A worker is routable while it is alive (heard from within `dead_after_s`), not draining, and
its engine makes progress: a worker whose heartbeats say it has work while its step counter
stands still for `stall_after_s` has a hung engine, however lively its agent. Dead workers are
forgotten `forget_after_s` after they died, so a churning pool does not grow the router.
Credentials are checked before a Register reaches here (router/worker_auth.py); the registry
binds each worker to the connection it registered from and refuses another connection's claim
on a live worker's id.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from router.protocol import Ack, Heartbeat, LoadReport, Register
from router.report_views import load_report_to_view, register_to_view
from router.routing_views import WorkerView
from router.transport import with_peer_host

ID_IN_USE = "worker_id in use by a live worker on another connection"


@dataclass
class _Worker:
    registration: Register
    registered_s: float
    last_seen_s: float
    identity: bytes | None = None
    alive: bool = True
    last_seq: dict[str, int] = field(default_factory=dict)  # per message TYPE: heartbeats and reports count apart
    report: LoadReport | None = None
    report_s: float = 0.0
    tier_ms: float | None = None
    died_s: float | None = None
    draining: bool = False
    steps: int | None = None  # the engine's step counter at its last change
    steps_changed_s: float = 0.0
    busy: bool = False  # its last heartbeat said the engine has work
    stalled: bool = False


class WorkerRegistry:
    """Liveness: a worker is dead once no message arrived for more than `dead_after_s`."""

    def __init__(self, dead_after_s: float = 2.0, stall_after_s: float = 30.0, forget_after_s: float = 600.0) -> None:
        if dead_after_s <= 0:
            raise ValueError(f"dead_after_s must be positive, got {dead_after_s}")
        if stall_after_s <= 0 or forget_after_s <= 0:
            raise ValueError("stall_after_s and forget_after_s must be positive")
        self.dead_after_s = dead_after_s
        self.stall_after_s = stall_after_s
        self.forget_after_s = forget_after_s
        self._workers: dict[str, _Worker] = {}
        self._rid_worker: dict[str, str] = {}
        self._inflight: dict[str, dict[str, None]] = {}  # worker_id -> ordered set of rids

    # --- membership ---

    def register(self, msg: Register, now: float, identity: bytes | None = None, peer_host: str | None = None) -> Ack:
        """Add, update or revive a worker. Sequence numbers restart: it may be a new process.

        In-flight tracking survives re-registration: whether a restart lost them is the router's call.
        A live worker's id is not handed to another connection (it must fall silent first).
        `peer_host`: where its connection comes from, the host of an http_url advertised as a wildcard.
        """
        msg = replace(msg, http_url=with_peer_host(msg.http_url, peer_host))
        known = self._workers.get(msg.worker_id)
        if known is not None and known.alive and identity is not None and known.identity not in (None, identity):
            return Ack(accepted=False, reason=ID_IN_USE)
        if known is None:
            self._workers[msg.worker_id] = _Worker(
                registration=msg, registered_s=now, last_seen_s=now, identity=identity, tier_ms=msg.tier_ms
            )
            self._inflight[msg.worker_id] = {}
            return Ack(accepted=True, reason="registered")
        reason = "revived" if not known.alive else "re-registered"
        known.registration = msg  # gpu, capacity or model may have changed on restart
        known.registered_s = known.last_seen_s = now
        known.identity = identity
        known.alive, known.died_s, known.draining = True, None, False
        known.last_seq = {}
        known.report = None  # the old load no longer describes this process
        known.steps, known.steps_changed_s, known.stalled = None, now, False
        return Ack(accepted=True, reason=reason)

    def speaks_for(self, worker_id: str, identity: bytes) -> bool:
        """Whether a message from connection `identity` may speak for `worker_id`."""
        worker = self._workers.get(worker_id)
        return worker is not None and (worker.identity is None or worker.identity == identity)

    def heartbeat(self, msg: Heartbeat, now: float) -> bool:
        """False when the worker is unknown, dead (it must re-register) or the seq is stale."""
        worker = self._newer(msg, now)
        if worker is None:
            return False
        worker.busy = msg.busy
        if msg.engine_steps is not None and msg.engine_steps != worker.steps:
            worker.steps, worker.steps_changed_s = msg.engine_steps, now
            worker.stalled = False
        elif not msg.busy:
            worker.steps_changed_s = now  # an idle engine need not step
            worker.stalled = False
        return True

    def report(self, msg: LoadReport, now: float) -> bool:
        """Keep the newest report; an older or repeated seq (reordering, replay) is ignored."""
        worker = self._newer(msg, now)
        if worker is None:
            return False
        worker.report = msg
        worker.report_s = now
        return True

    def _newer(self, msg: Heartbeat | LoadReport, now: float) -> _Worker | None:
        """The live sender of `msg` when its seq is newer than the last of its kind, marked as
        heard from now with the draining flag it sent; None for an unknown, dead or stale one."""
        worker = self._live(msg.worker_id)
        if worker is None or msg.seq <= worker.last_seq.get(msg.TYPE, -1):
            return None
        worker.last_seq[msg.TYPE] = msg.seq
        worker.last_seen_s = now
        worker.draining = msg.draining
        return worker

    def touch(self, worker_id: str, now: float) -> bool:
        """Any other message (token chunks, errors) also proves the worker is alive."""
        worker = self._live(worker_id)
        if worker is None:
            return False
        worker.last_seen_s = now
        return True

    def reap(self, now: float) -> list[str]:
        """Declare silent workers dead and busy ones whose engine stopped stepping stalled;
        returns only those newly so (their work needs moving)."""
        lost = []
        for worker_id, worker in self._workers.items():
            if worker.alive and now - worker.last_seen_s > self.dead_after_s:
                worker.alive, worker.died_s = False, now
                lost.append(worker_id)
            elif (
                worker.alive
                and worker.busy
                and not worker.stalled
                and now - worker.steps_changed_s > self.stall_after_s
            ):
                worker.stalled = True
                lost.append(worker_id)
        return lost

    def forget_dead(self, now: float) -> list[str]:
        """Drop workers dead for longer than `forget_after_s` (and their in-flight lists)."""
        gone = [
            wid
            for wid, w in self._workers.items()
            if not w.alive and w.died_s is not None and now - w.died_s > self.forget_after_s
        ]
        for worker_id in gone:
            del self._workers[worker_id]
            for rid in self._inflight.pop(worker_id, {}):
                self._rid_worker.pop(rid, None)
        return gone

    def is_stalled(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.stalled

    def set_tier(self, worker_id: str, tier_ms: float | None) -> None:
        """PolyServe: the TPOT tier a worker serves; shows up in its view."""
        self._workers[worker_id].tier_ms = tier_ms

    # --- queries ---

    def is_alive(self, worker_id: str) -> bool:
        worker = self._workers.get(worker_id)
        return worker is not None and worker.alive

    def identity_of(self, worker_id: str) -> bytes | None:
        """The transport address the worker registered from, if the router passed one."""
        worker = self._workers.get(worker_id)
        return None if worker is None else worker.identity

    def registration(self, worker_id: str) -> Register | None:
        worker = self._workers.get(worker_id)
        return None if worker is None else worker.registration

    def worker_ids(self) -> list[str]:
        return list(self._workers)

    def views(self, now: float) -> list[WorkerView]:
        """Every known worker, in registration order; `healthy` is False once it has gone silent."""
        out = []
        for worker_id, worker in self._workers.items():
            healthy = (
                worker.alive
                and now - worker.last_seen_s <= self.dead_after_s
                and not worker.draining
                and not worker.stalled
            )
            inflight = len(self._inflight[worker_id])
            if worker.report is None:
                view = register_to_view(
                    worker.registration, worker.registered_s, worker.tier_ms, healthy=healthy, inflight=inflight
                )
            else:
                view = load_report_to_view(
                    worker.report,
                    inflight,
                    worker.report_s,
                    worker.tier_ms,
                    registration=worker.registration,
                    healthy=healthy,
                )
            out.append(view)
        return out

    # --- in-flight requests ---

    def track(self, rid: str, worker_id: str) -> None:
        """Record that `rid` now runs on `worker_id` (moving it if it ran elsewhere: migration)."""
        if worker_id not in self._workers:
            raise KeyError(f"unknown worker {worker_id!r}")
        self.untrack(rid)
        self._rid_worker[rid] = worker_id
        self._inflight[worker_id][rid] = None

    def untrack(self, rid: str) -> str | None:
        """Forget a finished or aborted request; returns the worker it was on."""
        worker_id = self._rid_worker.pop(rid, None)
        if worker_id is not None:
            self._inflight[worker_id].pop(rid, None)
        return worker_id

    def worker_of(self, rid: str) -> str | None:
        return self._rid_worker.get(rid)

    def inflight_on(self, worker_id: str) -> list[str]:
        """Requests sent to the worker and not finished, oldest first: what to resubmit if it dies."""
        return list(self._inflight.get(worker_id, ()))

    def _live(self, worker_id: str) -> _Worker | None:
        worker = self._workers.get(worker_id)
        return worker if worker is not None and worker.alive else None
