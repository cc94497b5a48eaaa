"""Prompt-prefix block hashes for RouteRequest.prefix_hashes (cache-aware and GoodServe routing).

Block i's hash covers tokens [0, (i+1)·block_tokens): each hash chains the previous one with the
block's token ids, so two prompts share hash i exactly when they share their first i+1 blocks,
which is what a worker's radix cache can reuse. Only full blocks are hashed (a partial tail block
says nothing reliable about reuse). blake2b keeps the hashes stable across processes and runs.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

DEFAULT_BLOCK_TOKENS = 64  # GoodServePolicy.block_tokens' default: the two must agree
DEFAULT_MAX_BLOCKS = 2048  # 128k tokens of 64-token blocks: longer prompts share no more routing value


def prefix_hashes(
    input_ids: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS, max_blocks: int | None = DEFAULT_MAX_BLOCKS
) -> tuple[int, ...]:
    """Chained 63-bit hashes of the leading full blocks of `input_ids`."""
    if block_tokens <= 0:
        raise ValueError(f"block_tokens must be positive, got {block_tokens}")
    n_blocks = len(input_ids) // block_tokens
    if max_blocks is not None:
        n_blocks = min(n_blocks, max_blocks)
    if n_blocks == 0:
        return ()
    ids = array("q", input_ids[: n_blocks * block_tokens])
    raw, step = ids.tobytes(), block_tokens * ids.itemsize
    out = []
    prev = b""
    for i in range(n_blocks):
        digest = hashlib.blake2b(prev + raw[i * step : (i + 1) * step], digest_size=8).digest()
        out.append(int.from_bytes(digest, "little") >> 1)  # non-negative, fits a signed 64-bit int
        prev = digest
    return tuple(out)
