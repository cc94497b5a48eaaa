"""PolyServe dynamic chunking (§4.7) as a PD prefill worker runs it, pass by pass.

The worker starts SGLang at 2B (buffers are sized on the start-up value) and runs normal passes
at B; a pass whose next request has B < remaining < 2B tokens finishes it whole and alone.
"""

from __future__ import annotations

from scheduler.core.dynamic_chunking import ChunkStep, budget_from_startup, dynamic_chunk


class PrefillChunker:
    def __init__(self, startup_chunk: int, page_size: int) -> None:
        self.startup_chunk = startup_chunk
        self.budget = budget_from_startup(startup_chunk)
        self.page_size = page_size
        self.whole_finish_passes = 0  # passes that chose to finish a request whole
        self.finished_whole = 0  # ... and did (its last chunk ran in that step)

    def step(self, next_uncached: int | None) -> ChunkStep:
        """This pass's budget, given the uncached tokens of the request prefilled next (None: none)."""
        return dynamic_chunk(self.budget, next_uncached, self.page_size, self.startup_chunk)

    def record(self, step: ChunkStep, finished_whole: bool) -> None:
        if not step.admit_others:
            self.whole_finish_passes += 1
            self.finished_whole += int(finished_whole)

    def status(self) -> dict[str, int]:
        return {"whole_finish_passes": self.whole_finish_passes, "finished_whole": self.finished_whole}
