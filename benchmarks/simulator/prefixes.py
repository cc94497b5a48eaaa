"""The router's prefix-block hashes of a trace request, without building its prompt.

Live, the load generator builds each prompt from the trace's prefix information (Mooncake's
hash ids, an agent session's reused context; benchmarks/workloads/text.py) and the router hashes
its 64-token blocks (router/prefix.py). Two prompts share router block j exactly when they share
every token up to its end. Here the same equality is computed from the trace itself: a router
block is shared when all its tokens lie in trace blocks the two requests share, chained so a
difference anywhere before it breaks every later match; tokens the trace gives no prefix for are
unique to the request. Only ints are hashed: Python salts str hashes per process, not ints.
"""

from __future__ import annotations

import hashlib
import itertools

from benchmarks.workloads.traces import TraceRequest
from router.prefix import DEFAULT_BLOCK_TOKENS, DEFAULT_MAX_BLOCKS

_unique = itertools.count(1)


def prefix_hashes(
    req: TraceRequest, trace_block_tokens: int, block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> tuple[int, ...]:
    """Chained hashes of the prompt's full router blocks, equal across requests exactly where
    their prompts share every token so far; () when the trace has no prefix information."""
    shared_ids: tuple[object, ...]
    if req.prefix_hash_ids:
        shared_ids, owner_block = tuple(req.prefix_hash_ids), max(1, trace_block_tokens)
    elif req.prefix_tokens and req.program_id is not None:
        # an agent session's reused context: the session's own leading tokens
        session = int.from_bytes(hashlib.blake2b(req.program_id.encode(), digest_size=8).digest(), "little")
        shared_ids, owner_block = (session,), max(1, req.prefix_tokens)
    else:
        return ()
    n_blocks = min(req.prompt_tokens // block_tokens, DEFAULT_MAX_BLOCKS)
    out = []
    prev = 0
    for j in range(n_blocks):
        first, last = j * block_tokens // owner_block, ((j + 1) * block_tokens - 1) // owner_block
        if last < len(shared_ids):
            key: object = (prev, shared_ids[first : last + 1], j)
        else:
            key = (prev, -next(_unique))
        prev = hash(key)
        out.append(prev)
    return tuple(out)
