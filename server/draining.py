"""Graceful drain of a worker: on SIGTERM it stops admitting (new generation requests get 503
`draining`, /health turns 503 so load balancers and the router stop sending), lets the requests
it holds finish within a timeout, then exits; a second SIGTERM (or the timeout) exits at once.

`Drain` is the shared flag (the HTTP edge reads it, the worker agent reports it to the router);
`install_drain_handler` wires SIGTERM to it in the HTTP process.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

POLL_S = 0.2


class Drain:
    def __init__(self) -> None:
        self.active = False
        self.since: float | None = None  # time.monotonic() it started

    def start(self) -> bool:
        """Begin draining; False when it already had."""
        if self.active:
            return False
        self.active, self.since = True, time.monotonic()
        return True


def drain_then_exit(
    drain: Drain,
    busy: Callable[[], int],
    timeout_s: float,
    exit_now: Callable[[], None],
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> str:
    """Wait until nothing is `busy` (requests queued, running or streaming) or `timeout_s` has
    passed, then `exit_now()`; returns why it ended ("drained" or "timeout")."""
    drain.start()
    deadline = clock() + timeout_s
    why = "timeout"
    while clock() < deadline:
        if busy() == 0:
            why = "drained"
            break
        sleep(POLL_S)
    logger.info("drain ended (%s): exiting", why)
    exit_now()
    return why


def install_drain_handler(
    drain: Drain,
    busy: Callable[[], int],
    timeout_s: float,
    exit_now: Callable[[], None],
    loop: asyncio.AbstractEventLoop | None = None,
) -> Callable[[int, Any], None]:
    """SIGTERM starts a drain in a thread, which calls `exit_now` (end the process tree) when
    it is over; a second SIGTERM calls it at once. Returns the handler it installed. With a
    `loop`, the handler is that loop's (replacing one registered there, as SGLang's tokenizer
    manager registers its own: a plain signal handler would run beside it, not instead)."""

    def on_term(signum: int, frame: Any) -> None:
        if not drain.start():
            logger.warning("second SIGTERM while draining: exiting now")
            exit_now()
            return
        logger.info("SIGTERM: draining (no new requests, up to %.0f s for the ones in flight)", timeout_s)
        threading.Thread(
            target=drain_then_exit, args=(drain, busy, timeout_s, exit_now), name="slo-drain", daemon=True
        ).start()

    if loop is None:
        signal.signal(signal.SIGTERM, on_term)
    else:
        loop.add_signal_handler(signal.SIGTERM, on_term, signal.SIGTERM, None)
    return on_term
