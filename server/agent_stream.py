"""One streamed chunk of the worker's own /generate, as the agent reads it.

The agent's requests are streamed as deltas (server/delta_stream.py), so every chunk carries only
its new output ids. A chunk ends the request when it has a finish reason, or an error object;
an abort that the scheduler shed carries the shed's reason (scheduler/core/shed_wire.py), which
the router passes on to its client instead of retrying it elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from scheduler.core.shed_wire import Shed, shed_from

DATA = b"data: "
DONE = b"data: [DONE]"


@dataclass(frozen=True)
class Chunk:
    token_ids: list[int]
    meta: dict[str, Any]
    finish: str | None = None  # the finish reason's type once it ended normally
    error_status: int | None = None  # it ended in error (an abort included)
    error_message: str = ""
    shed: Shed | None = None


def _status(value: Any, default: int) -> int:
    status = value if isinstance(value, int) and not isinstance(value, bool) else default
    return status if 400 <= status < 600 else default


def parse_line(line: bytes) -> Chunk | None:
    """The chunk an SSE line carries (None: not a data line, or the [DONE] marker).
    ValueError when its JSON is malformed."""
    line = line.strip()
    if not line.startswith(DATA) or line == DONE:
        return None
    obj = orjson.loads(line[len(DATA) :])
    if not isinstance(obj, dict):
        raise ValueError("a stream chunk is not a JSON object")
    if "error" in obj:
        err = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
        shed = shed_from(err)
        status = shed.status if shed is not None else _status(err.get("code"), 500)
        return Chunk([], {}, error_status=status, error_message=str(err.get("message")), shed=shed)
    meta = obj.get("meta_info") or {}
    ids = obj.get("output_ids") or []
    if not isinstance(ids, list) or not isinstance(meta, dict):
        raise ValueError("a stream chunk has malformed output_ids or meta_info")
    finish = meta.get("finish_reason")
    if isinstance(finish, dict) and finish.get("type") == "abort":
        shed = shed_from(finish)
        status = shed.status if shed is not None else _status(finish.get("status_code"), 503)
        return Chunk(ids, meta, error_status=status, error_message=str(finish), shed=shed)
    reason = None if finish is None else str(finish.get("type") if isinstance(finish, dict) else finish)
    return Chunk(ids, meta, finish=reason)


def parse_error_body(status: int, body: bytes) -> Chunk:
    """A non-200 answer of the worker's /generate (a 400, or the HTTP edge's own shed)."""
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    err = obj.get("error") if isinstance(obj, dict) else None
    shed = shed_from(err) if isinstance(err, dict) else None
    return Chunk(
        [], {}, error_status=_status(status, 502), error_message=body[:500].decode(errors="replace"), shed=shed
    )
