"""The time each output token leaves the scheduler, carried to the HTTP process in SGLang's
`Req.customized_info` (sliced per token into meta_info), where the SLO report is computed."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from wire import TIER_KEY, TOKEN_TS_KEY


def stamp_token_times(reqs: Iterable[Any], is_declined: Callable[[str], bool]) -> None:
    """One stamp per new output id, and the request's admission tier with it. Reads rid,
    output_ids and customized_info of each SGLang Req."""
    now = time.time()
    for req in reqs:
        if req.customized_info is None:
            req.customized_info = {}
        stamps = req.customized_info.setdefault(TOKEN_TS_KEY, [])
        missing = len(req.output_ids) - len(stamps)
        if missing > 0:
            stamps.extend([now] * missing)
            req.customized_info.setdefault(TIER_KEY, []).extend([int(is_declined(req.rid))] * missing)


_STAMPING_CLASSES: dict[tuple[type, Callable[[str], bool]], type] = {}


def stamping_streamer_class(base: type, is_declined: Callable[[str], bool]) -> type:
    """A slot-compatible subclass of SGLang's output streamer that stamps before streaming (the
    streamer uses __slots__, so its method cannot be replaced on the instance)."""
    key = (base, is_declined)
    if key not in _STAMPING_CLASSES:

        def stream_output(self: Any, reqs: list, *args: Any, **kwargs: Any) -> Any:
            stamp_token_times(reqs, is_declined)
            return base.stream_output(self, reqs, *args, **kwargs)

        _STAMPING_CLASSES[key] = type(
            f"Stamping{base.__name__}", (base,), {"__slots__": (), "stream_output": stream_output}
        )
    return _STAMPING_CLASSES[key]
