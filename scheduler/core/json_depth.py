"""How deep a request body may nest: what every hop after the HTTP edge can still serialise.

orjson parses objects nested up to 1024 levels but serialises at most 254, and every process
after the edge (the router's worker link, the worker's middleware handing the body to SGLang)
serialises the body again. A body between the two limits used to be accepted and then fail
deep inside the router (a 503 "no healthy worker") or the worker (a 500); the edges refuse it
up front with a 400 naming `body`. The limit leaves room for the envelopes a body is wrapped in
on the way.
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_JSON_DEPTH = 128  # nesting levels a request body may use
_SERIALISABLE_DEPTH = 254  # orjson.dumps' own recursion limit


def unforwardable(body: Any) -> str | None:
    """Why `body` (parsed JSON) cannot be passed on, or None. Serialises it once inside enough
    list levels that only a body within MAX_JSON_DEPTH fits (orjson is C: no Python walk over a
    large body on the event loop)."""
    wrapped = body
    for _ in range(_SERIALISABLE_DEPTH - MAX_JSON_DEPTH):
        wrapped = [wrapped]
    try:
        orjson.dumps(wrapped)
    except orjson.JSONEncodeError as exc:
        if "recursion" in str(exc).lower():
            return f"nested deeper than {MAX_JSON_DEPTH} levels"
        return f"cannot be passed on: {exc}"
    return None
