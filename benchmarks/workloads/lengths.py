"""Length sources: a request's prompt and output lengths taken from somewhere other than the trace
that gives its arrivals.

SLOs-Serve's Summarizer and Reasoning scenarios (Tab. 2) replay Azure-Chatting arrivals with the
lengths of another dataset (arXiv summaries, s1K), so a workload names its arrivals' trace and,
apart, its length source; the source replaces each request's lengths and keeps everything else.

- ``arxiv-summ``: rows of Vidur's arXiv-summarization length file (Llama-2 tokenizer), keeping
  the rows whose prompt + summary fit OPT's 2048-token context, as the paper's OPT models must;
  what is kept has the paper's Tab. 4 Summarizer statistics. Drawn by a seeded shuffle, cycled.
- ``reasoning-synth``: SYNTHETIC, since s1K's traces are not in the data folder. Prompt,
  thinking and response lengths are drawn apart from distributions fitted to Tab. 4's Reasoning
  row; the output is thinking + response (the server sees one decode stream).
"""

from __future__ import annotations

import csv
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from benchmarks.workloads.traces import TraceRequest, resolve_data_dir

ARXIV_SUMM_FILE = "vidur-profiling/processed_traces/arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv"
OPT_CONTEXT_TOKENS = 2048  # the paper's OPT models' context: prompt + summary must fit it

Pairs = list[tuple[int, int]]  # (prompt tokens, output tokens)
DataDir = str | os.PathLike[str] | None


@cache
def _arxiv_rows(path: Path) -> tuple[tuple[int, int], ...]:
    with path.open(newline="", encoding="utf-8") as f:
        rows = ((int(r["num_prefill_tokens"]), int(r["num_decode_tokens"])) for r in csv.DictReader(f))
        return tuple((p, o) for p, o in rows if p > 0 and o > 0 and p + o <= OPT_CONTEXT_TOKENS)


def arxiv_summ_rows(data_dir: DataDir = None) -> tuple[tuple[int, int], ...]:
    """The arXiv summaries that fit OPT's context, in file order; a missing file raises."""
    path = resolve_data_dir(data_dir) / ARXIV_SUMM_FILE
    if not path.is_file():
        raise FileNotFoundError(f"arXiv summary lengths not found at {path}")
    return _arxiv_rows(path)


def _arxiv_summ(n: int, rng: random.Random, data_dir: DataDir) -> Pairs:
    """A seeded permutation of the rows, repeated when n exceeds them: no row twice before all once."""
    rows = list(arxiv_summ_rows(data_dir))
    out: Pairs = []
    while len(out) < n:
        rng.shuffle(rows)
        out += rows[: n - len(out)]
    return out


@dataclass(frozen=True)
class Part:
    """One length of a synthetic request, fitted to a table's mean and standard deviation.

    ``lognormal`` for right-skewed lengths (the table's p99 is above a normal's); ``normal`` clipped
    at ``cap`` for a length bounded above (the p99 below a normal's: a thinking budget)."""

    mean: float
    std: float
    shape: str  # "lognormal" or "normal"
    cap: float = math.inf

    def draw(self, rng: random.Random) -> int:
        if self.shape == "lognormal":
            var = math.log1p((self.std / self.mean) ** 2)
            x = rng.lognormvariate(math.log(self.mean) - var / 2, math.sqrt(var))
        else:
            x = rng.gauss(self.mean, self.std)
        return max(1, round(min(x, self.cap)))


# SLOs-Serve Tab. 4, Reasoning (s1K on Deepseek-R1-Qwen): mean, std (p99 in the comment)
REASONING_PROMPT = Part(127, 83, "lognormal")  # p99 421
REASONING_THINKING = Part(4693, 1442, "normal", cap=7297)  # p99 7297: a normal's would be 8047
REASONING_RESPONSE = Part(803, 280, "lognormal")  # p99 1650


def _reasoning_synth(n: int, rng: random.Random, data_dir: DataDir) -> Pairs:
    return [(REASONING_PROMPT.draw(rng), REASONING_THINKING.draw(rng) + REASONING_RESPONSE.draw(rng)) for _ in range(n)]


Source = Callable[[int, random.Random, DataDir], Pairs]
LENGTH_SOURCES: dict[str, Source] = {"arxiv-summ": _arxiv_summ, "reasoning-synth": _reasoning_synth}


def draw_lengths(source: str, n: int, seed: int, data_dir: DataDir = None) -> Pairs:
    """n (prompt, output) pairs of a source; the same for the same seed."""
    if source not in LENGTH_SOURCES:
        raise ValueError(f"unknown length source {source!r}; valid: {', '.join(LENGTH_SOURCES)}")
    return LENGTH_SOURCES[source](n, random.Random(seed), data_dir)


def with_lengths(
    requests: Sequence[TraceRequest], source: str, seed: int, data_dir: DataDir = None
) -> list[TraceRequest]:
    """The requests with the source's lengths, the k-th request the k-th draw; arrivals, rids and
    programs kept. Shared-prefix fields are cleared: they described the trace's own prompts."""
    pairs = draw_lengths(source, len(requests), seed, data_dir)
    return [
        replace(r, prompt_tokens=p, output_tokens=o, prefix_tokens=0, prefix_hash_ids=())
        for r, (p, o) in zip(requests, pairs)
    ]
