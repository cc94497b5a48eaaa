"""PolyServe dynamic chunking for PD prefill workers (§4.7).

A prefill worker keeps a token budget B per step, so one step never runs long enough to blow
the next round's wait. Strict chunking makes a request of B < r < 2B remaining tokens take two
steps (three or four when it starts behind other work); dynamic chunking prefills all r tokens
in one step instead and admits nothing else into it, so the step stays under 2B tokens.

Start-up buffers are sized on SGLang's chunked_prefill_size, so a worker that chunks dynamically
starts with 2B (`startup_chunk_size`) and runs normal steps at B (`budget_from_startup`).
"""

from __future__ import annotations

from dataclasses import dataclass

STARTUP_FACTOR = 2  # a whole-finish step prefills fewer than 2B tokens


@dataclass(frozen=True)
class ChunkStep:
    chunk: int  # the prefill token budget for this step
    admit_others: bool  # False: the step finishes one request whole and takes nothing else


def startup_chunk_size(budget: int) -> int:
    """The chunked_prefill_size a dynamic-chunking prefill worker must start with."""
    return STARTUP_FACTOR * budget


def budget_from_startup(startup_chunk: int) -> int:
    """The normal-step budget B of a worker started with `startup_chunk_size(B)`."""
    return max(1, startup_chunk // STARTUP_FACTOR)


def dynamic_chunk(budget: int, remaining: int | None, page_size: int = 1, ceiling: int | None = None) -> ChunkStep:
    """This step's budget, given the remaining uncached tokens of the next request to prefill.

    `remaining` None means no request is next. The whole-finish budget is rounded up to pages
    (SGLang compares page-rounded lengths with the budget); `ceiling` (the start-up size, which
    buffers are sized on) is never exceeded: a request that would need more is chunked as usual.
    """
    if remaining is None or not budget < remaining < STARTUP_FACTOR * budget:
        return ChunkStep(budget, True)
    page = max(1, page_size)
    chunk = -(-remaining // page) * page
    if ceiling is not None and chunk > ceiling:
        return ChunkStep(budget, True)
    return ChunkStep(chunk, False)
