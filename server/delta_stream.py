"""A streamed request's chunks as deltas: what the router's agent reads.

SGLang's default stream (without --incremental-streaming-output) repeats every output id so
far, and the per-token lists of meta_info, in every chunk: O(N^2) bytes over an N-token answer,
and past ~40k tokens a single SSE line outgrows aiohttp's line limit. The agent needs only each
chunk's new tokens, so its requests are streamed as deltas whatever the server's flag says
(direct clients keep SGLang's format). Text is left out: the router detokenizes itself.
"""

from __future__ import annotations

from typing import Any

from wire import TIER_KEY, TOKEN_TS_KEY

PER_TOKEN_META = (TOKEN_TS_KEY, TIER_KEY)  # meta_info lists with one entry per output token


class DeltaStream:
    def __init__(self) -> None:
        self.sent = 0  # output ids already streamed

    def next(self, out: dict[str, Any]) -> dict[str, Any]:
        """The chunk with only what is new since the last one (a new dict: SGLang's is shared)."""
        ids = out.get("output_ids")
        if not isinstance(ids, list):
            return out
        start, self.sent = self.sent, max(self.sent, len(ids))
        meta = out.get("meta_info")
        if isinstance(meta, dict):
            meta = {k: v[start:] if k in PER_TOKEN_META and isinstance(v, list) else v for k, v in meta.items()}
        return {**out, "output_ids": ids[start:], "text": "", "meta_info": meta}
