"""uvicorn's server with the router's own shutdown order.

On SIGTERM uvicorn stops accepting connections, waits up to `timeout_graceful_shutdown` for the
open ones and then cancels their tasks; only after that does the app's lifespan shutdown run. A
stream longer than that wait was cut without a word: its client got no error event and no
[DONE], and its worker was never told to abort. Here the router first ends every open stream
itself (the 503 error event, an Abort to each worker, nothing new admitted), so the responses
complete and their connections close well inside uvicorn's wait.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable

import uvicorn

logger = logging.getLogger(__name__)


class GracefulServer(uvicorn.Server):
    """`before_drain` runs once on shutdown, after the listeners close and before uvicorn waits
    for (and then cancels) the open requests."""

    def __init__(self, config: uvicorn.Config, before_drain: Callable[[], Awaitable[None]]) -> None:
        super().__init__(config)
        self._before_drain = before_drain

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # no new connections while the streams are being ended
            server.close()
        try:
            await self._before_drain()
        except Exception:  # noqa: BLE001 - uvicorn's own shutdown must still run
            logger.exception("ending the open streams failed")
        await super().shutdown(sockets)
