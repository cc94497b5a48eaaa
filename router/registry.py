"""Router-side worker membership: who is registered, who is alive, what each last reported and
which requests the router has in flight where.

Pure bookkeeping with the clock passed in (`now`), so liveness and failover are unit-testable
without sockets or sleeps. The router feeds it every worker message and calls `reap` on a timer.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass, replace

from router.protocol import Ack, Heartbeat, LoadReport, Register, hash_api_key, load_report_to_view, register_to_view
from router.transport import with_peer_host
from router.views import WorkerView


@dataclass
class _Worker:
    registration: Register
    registered_s: float
    last_seen_s: float
    identity: bytes | None = None
    alive: bool = True
    heartbeat_seq: int = -1
    report_seq: int = -1
    report: LoadReport | None = None
    report_s: float = 0.0
    tier_ms: float | None = None


class WorkerRegistry:
    """Liveness: a worker is dead once no message arrived for more than `dead_after_s`."""

    def __init__(self, dead_after_s: float = 2.0, api_key: str | None = None) -> None:
        if dead_after_s <= 0:
            raise ValueError(f"dead_after_s must be positive, got {dead_after_s}")
        self.dead_after_s = dead_after_s
        self._key_hash = hash_api_key(api_key) if api_key is not None else None
        self._workers: dict[str, _Worker] = {}
        self._rid_worker: dict[str, str] = {}
        self._inflight: dict[str, dict[str, None]] = {}  # worker_id -> ordered set of rids

    # --- membership ---

    def register(self, msg: Register, now: float, identity: bytes | None = None, peer_host: str | None = None) -> Ack:
        """Add, update or revive a worker. Sequence numbers restart: it may be a new process.

        In-flight tracking survives re-registration: whether a restart lost them is the router's call.
        `peer_host`: where its connection comes from, the host of an http_url advertised as a wildcard.
        """
        if self._key_hash is not None and not (
            msg.api_key_hash is not None and hmac.compare_digest(msg.api_key_hash, self._key_hash)
        ):
            reason = "missing api key" if msg.api_key_hash is None else "wrong api key"
            return Ack(accepted=False, reason=reason)
        msg = replace(msg, http_url=with_peer_host(msg.http_url, peer_host))
        known = self._workers.get(msg.worker_id)
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
        known.alive = True
        known.heartbeat_seq = known.report_seq = -1
        known.report = None  # the old load no longer describes this process
        return Ack(accepted=True, reason=reason)

    def heartbeat(self, msg: Heartbeat, now: float) -> bool:
        """False when the worker is unknown, dead (it must re-register) or the seq is stale."""
        worker = self._live(msg.worker_id)
        if worker is None or msg.seq <= worker.heartbeat_seq:
            return False
        worker.heartbeat_seq = msg.seq
        worker.last_seen_s = now
        return True

    def report(self, msg: LoadReport, now: float) -> bool:
        """Keep the newest report; an older or repeated seq (reordering, replay) is ignored."""
        worker = self._live(msg.worker_id)
        if worker is None or msg.seq <= worker.report_seq:
            return False
        worker.report_seq = msg.seq
        worker.report = msg
        worker.report_s = now
        worker.last_seen_s = now
        return True

    def touch(self, worker_id: str, now: float) -> bool:
        """Any other message (token chunks, errors) also proves the worker is alive."""
        worker = self._live(worker_id)
        if worker is None:
            return False
        worker.last_seen_s = now
        return True

    def reap(self, now: float) -> list[str]:
        """Declare silent workers dead; returns only those newly dead (their work needs moving)."""
        dead = []
        for worker_id, worker in self._workers.items():
            if worker.alive and now - worker.last_seen_s > self.dead_after_s:
                worker.alive = False
                dead.append(worker_id)
        return dead

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
            healthy = worker.alive and now - worker.last_seen_s <= self.dead_after_s
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
