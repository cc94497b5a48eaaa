"""The router's sends to its workers: sealed with the worker's session key, never raising.

A send that cannot happen (unknown worker, no session, closed endpoint) is a False the caller
acts on, not an exception: a dead worker is routine for the dispatcher, not an error.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Coroutine
from typing import Any

import zmq

from router.membership import WorkerRegistry
from router.protocol import Abort, Message, ProtocolError
from router.transport import RouterEndpoint
from router.worker_auth import RouterAuth

logger = logging.getLogger(__name__)


class WorkerOutbox:
    """Sends to workers by id, and keeps the fire-and-forget sends (aborts) it started."""

    def __init__(
        self, endpoint: RouterEndpoint, registry: WorkerRegistry, auth: RouterAuth, counters: Counter[str]
    ) -> None:
        self.endpoint = endpoint
        self.registry = registry
        self.auth = auth
        self.counters = counters
        self._background: set[asyncio.Task[Any]] = set()

    async def send(self, worker_id: str, msg: Message) -> bool:
        """False when the worker is unknown, gone, has no session, or the endpoint is closed."""
        identity = self.registry.identity_of(worker_id)
        if identity is None:
            return False
        try:
            sealed = self.auth.seal(worker_id, msg)
            if sealed is None:
                return False
            return await self.endpoint.send(identity, sealed)
        except (zmq.ZMQError, ProtocolError) as exc:
            logger.warning("could not send %s to %s: %s", msg.TYPE, worker_id, exc)
            return False

    async def abort_stale(self, worker_id: str, rid: str) -> None:
        """Abort a copy the router moved away from. A hung worker's socket still takes it (ZMQ
        queues it), so it stops the copy the moment it wakes; a worker that is gone is
        reconciled (`orphans_aborted`) when it registers again."""
        if await self.send(worker_id, Abort(rid=rid)):
            self.counters["stale_aborts_sent"] += 1

    def spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run `coro` in the background (a send nobody waits for); `close` cancels what is left."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
