"""The server's zero-load speed, so the papers' GPU targets can be rescaled to this engine.

One request at a time (nothing else in flight): TTFT at a few prompt lengths gives the
prefill line, the steady inter-token time of the same requests gives the per-token time.
Medians, because the first request after start-up and the odd OS hiccup are slow.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import replace

from benchmarks.goodput.loadgen import LoadGenerator, LoadOptions, PromptFor
from benchmarks.goodput.mixes import Calibration
from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.traces import TraceRequest


def calibration_requests(prompt_lens: tuple[int, ...], output_tokens: int, reps: int) -> list[PlannedRequest]:
    return [
        PlannedRequest(
            TraceRequest(arrival_s=0.0, prompt_tokens=n, output_tokens=output_tokens, rid=f"cal{n}.{k}"), "none", {}
        )
        for n in prompt_lens
        for k in range(reps)
    ]


async def _measure(url: str, prompt_for: PromptFor, opts: LoadOptions, planned: list[PlannedRequest]) -> Calibration:
    ttft: dict[int, list[float]] = {}
    gaps: list[float] = []
    for i, p in enumerate(planned):  # sequentially: zero load
        # a fresh prompt every time: a repeated one would hit the radix cache and skip its prefill
        (rec,) = await LoadGenerator(url, prompt_for, replace(opts, seed=opts.seed + 7919 * (i + 1))).run([p])
        if rec.finish_s is None or len(rec.token_s) < 2 or rec.send_s is None:
            raise RuntimeError(f"calibration request {rec.key} failed: {rec.error or 'too few tokens'}")
        ttft.setdefault(p.req.prompt_tokens, []).append(1000.0 * (rec.token_s[0] - rec.send_s))
        gaps.append(1000.0 * (rec.token_s[-1] - rec.token_s[0]) / (len(rec.token_s) - 1))
    points = [(n, statistics.median(v)) for n, v in sorted(ttft.items())]
    return Calibration.fit(points, statistics.median(gaps))


def calibrate(
    url: str,
    prompt_for: PromptFor,
    opts: LoadOptions,
    prompt_lens: tuple[int, ...] = (32, 256),
    output_tokens: int = 24,
    reps: int = 3,
) -> Calibration:
    """Zero-load TTFT line and per-token time of the server at `url` (a few seconds on CPU)."""
    planned = calibration_requests(prompt_lens, output_tokens, reps)
    random.Random(0).shuffle(planned)  # no warm-up order effect favouring one length
    return asyncio.run(_measure(url, prompt_for, opts, planned))
