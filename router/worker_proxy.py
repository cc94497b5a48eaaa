"""The few calls the router's HTTP layer makes on workers' own HTTP servers (model info, server
info, cache flushes), asked over the authenticated worker link: the router never calls a URL a
worker announced and never hands a worker a client's credentials."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from router.protocol import FetchReply
from router.routing_views import WorkerView

Fetch = Callable[[str, str, str, float], Awaitable[FetchReply]]  # worker id, method, path, timeout


class WorkerUnavailable(RuntimeError):
    """No healthy worker answered a proxied call; the HTTP layer answers 503 or 502."""

    def __init__(self, message: str, status: int = 503) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Proxied:
    """A worker's own HTTP answer, fetched over the worker link."""

    status_code: int
    content_type: str
    text: str

    @property
    def content(self) -> bytes:
        return self.text.encode()

    def json(self) -> Any:
        return json.loads(self.text)


class WorkerProxy:
    """GETs from the first healthy worker that answers, and cache flushes on every one."""

    def __init__(self, fetch: Fetch, healthy: Callable[[], list[WorkerView]], timeout_s: float) -> None:
        self._fetch_reply = fetch
        self._healthy = healthy
        self.timeout_s = timeout_s

    def _fetchable(self) -> list[str]:
        return [v.worker_id for v in self._healthy()]

    async def _fetch(self, worker_id: str, method: str, path: str) -> Proxied:
        reply = await self._fetch_reply(worker_id, method, path, self.timeout_s)
        return Proxied(reply.status, reply.content_type, reply.body)

    async def get(self, path: str) -> tuple[str, Proxied]:
        """GET `path` from the first healthy worker that answers (worker id, response)."""
        workers = self._fetchable()
        if not workers:
            raise WorkerUnavailable("no healthy worker")
        errors = []
        for worker_id in workers:
            try:
                return worker_id, await self._fetch(worker_id, "GET", path)
            except (TimeoutError, asyncio.TimeoutError, ConnectionError) as exc:
                errors.append(f"{worker_id}: {type(exc).__name__}: {exc}")
        raise WorkerUnavailable("; ".join(errors), status=502)

    async def flush_cache(self) -> dict[str, str]:
        """POST /flush_cache on every healthy worker; worker id -> "ok" or what went wrong."""
        workers = self._fetchable()
        if not workers:
            raise WorkerUnavailable("no healthy worker")

        async def one(worker_id: str) -> str:
            try:
                resp = await self._fetch(worker_id, "POST", "/flush_cache")
            except (TimeoutError, asyncio.TimeoutError, ConnectionError) as exc:
                return f"{type(exc).__name__}: {exc}"
            return "ok" if resp.status_code == 200 else f"HTTP {resp.status_code}: {resp.text[:200]}"

        results = await asyncio.gather(*(one(w) for w in workers))
        return dict(zip(workers, results))
