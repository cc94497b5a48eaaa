"""From a trace name to the planned requests of one run: window, count, lengths, rate, SLO mix.

The rate is always "arrival units per second" (a unit is a lone request or a whole program).
Trace arrivals are rescaled so their mean rate is the one asked for, which keeps the trace's
burstiness; `poisson` arrivals replace them with a seeded Poisson process of that rate. Lengths
are scaled and capped before the mix is applied, so deadline mixes (GoodServe's multiple of the
solo latency) see the lengths that are really sent.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.goodput.mixes import Scale, apply_mix
from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.lengths import LENGTH_SOURCES, with_lengths
from benchmarks.workloads.traces import (
    MOONCAKE_BLOCK_TOKENS,
    TraceRequest,
    limit,
    load,
    poisson_arrivals,
    scale_rate,
    window,
)

# Where a seed's trace window starts, per seed, for runs that take trace arrivals: other requests
# and another arrival pattern (the fixed-SLO mixes draw nothing, so the same window under every
# seed would be one run).
SEED_SPAN_S = 600.0


@dataclass(frozen=True)
class WorkloadSpec:
    trace: str = "azure-conv"
    data_dir: str | None = None
    start_s: float = 0.0  # the trace window's start
    window_s: float | None = None  # the trace window's length; None = to the end
    units: int = 100  # arrival units (lone requests or programs) taken from the window
    arrivals: str = "trace"  # "trace" (rescaled timestamps) or "poisson"
    length_scale: float = 1.0
    max_prompt: int = 1024
    max_output: int = 256
    mix: str = "tempo"
    seed: int = 0
    cycle: bool = False  # a window with fewer than `units` units repeats (fresh rids) until it has them
    lengths: str | None = None  # a length source (benchmarks.workloads.lengths) replacing the trace's lengths

    def __post_init__(self) -> None:
        if self.arrivals not in ("trace", "poisson"):
            raise ValueError(f"arrivals must be 'trace' or 'poisson', got {self.arrivals!r}")
        if self.units < 1:
            raise ValueError(f"units must be >= 1, got {self.units}")
        if not (math.isfinite(self.length_scale) and self.length_scale > 0):
            raise ValueError(f"length_scale must be > 0, got {self.length_scale}")
        if self.max_prompt < 1 or self.max_output < 1:
            raise ValueError("max_prompt and max_output must be >= 1")
        if self.lengths is not None and self.lengths not in LENGTH_SOURCES:
            raise ValueError(f"unknown length source {self.lengths!r}; valid: {', '.join(LENGTH_SOURCES)}")

    @classmethod
    def from_flags(cls, args: argparse.Namespace, seed: int, **more: Any) -> WorkloadSpec:
        """The workload the commands' shared flags describe (--trace, --units, --arrivals,
        --length-scale, --max-prompt, --max-output, --mix), for one seed; `more` sets the fields
        only some commands take."""
        return cls(
            trace=args.trace,
            units=args.units,
            arrivals=args.arrivals,
            length_scale=args.length_scale,
            max_prompt=args.max_prompt,
            max_output=args.max_output,
            mix=args.mix,
            seed=seed,
            **more,
        )

    @property
    def block_tokens(self) -> int:
        """Mooncake's 512-token hash blocks at this length scale (shared prefixes keep their share)."""
        return max(1, round(MOONCAKE_BLOCK_TOKENS * self.length_scale))


def _shaped(r: TraceRequest, spec: WorkloadSpec) -> TraceRequest:
    prompt = min(spec.max_prompt, max(1, round(r.prompt_tokens * spec.length_scale)))
    output = min(spec.max_output, max(1, round(r.output_tokens * spec.length_scale)))
    prefix = min(prompt, round(r.prefix_tokens * spec.length_scale))
    return replace(r, prompt_tokens=prompt, output_tokens=output, prefix_tokens=prefix)


def _unit_starts(requests: list[TraceRequest]) -> list[float]:
    starts: dict[object, float] = {}
    for i, r in enumerate(requests):
        key = r.program_id if r.program_id is not None else ("lone", i)
        starts[key] = min(starts.get(key, math.inf), r.arrival_s)
    return sorted(starts.values())


def base_requests(spec: WorkloadSpec) -> list[TraceRequest]:
    """The trace's window, `units` units of it, lengths (the trace's, or the length source's drawn
    with the spec's seed) shaped; arrivals still the trace's own."""
    loaded = load(spec.trace, spec.data_dir)
    reqs = loaded.requests
    if spec.start_s or spec.window_s is not None:
        end = math.inf if spec.window_s is None else spec.start_s + spec.window_s
        reqs = window(reqs, spec.start_s, end)
    reqs = limit(reqs, spec.units)
    if not reqs:
        raise ValueError(f"trace {spec.trace!r} has no request in the chosen window")
    if spec.cycle:
        reqs = _cycled(reqs, spec.units)
    if spec.lengths is not None:
        reqs = with_lengths(reqs, spec.lengths, spec.seed, spec.data_dir)
    return [_shaped(r, spec) for r in reqs]


def _cycled(requests: list[TraceRequest], units: int) -> list[TraceRequest]:
    """The window repeated back to back until it holds `units` units: copy k gets rids and
    program ids suffixed `~k` and arrivals shifted by k spans (one mean gap past the last)."""
    n = len(_unit_starts(requests))
    if n >= units:
        return requests
    starts = _unit_starts(requests)
    span = starts[-1] - starts[0] + (starts[-1] - starts[0]) / max(n - 1, 1)
    out = list(requests)
    for k in range(1, -(-units // n)):

        def tag(x: str, k: int = k) -> str:
            return f"{x}~{k}"

        out += [
            replace(
                r,
                rid=tag(r.rid),
                program_id=None if r.program_id is None else tag(r.program_id),
                parents=tuple(tag(p) for p in r.parents),
                arrival_s=r.arrival_s + k * span,
            )
            for r in requests
        ]
    return limit(out, units)


def natural_rate(requests: list[TraceRequest]) -> float | None:
    """Units per second of the trace as recorded; None when all units arrive at once."""
    starts = _unit_starts(requests)
    span = starts[-1] - starts[0] if starts else 0.0
    return (len(starts) - 1) / span if span > 0 else None


def at_rate(requests: list[TraceRequest], rate: float | None, spec: WorkloadSpec) -> list[TraceRequest]:
    """Arrivals at `rate` units/s (None = the trace's own timestamps)."""
    if rate is None:
        return requests
    if spec.arrivals == "poisson":
        return poisson_arrivals(requests, rate, seed=spec.seed)
    own = natural_rate(requests)
    if own is None:  # the window's units all arrive together: spread them as Poisson
        return poisson_arrivals(requests, rate, seed=spec.seed)
    first = min(_unit_starts(requests))
    return scale_rate([replace(r, arrival_s=r.arrival_s - first) for r in requests], rate / own)


def plan(spec: WorkloadSpec, rate: float | None, scale: Scale) -> list[PlannedRequest]:
    """The same requests, SLOs and arrivals for every server: a function of the spec and rate."""
    return apply_mix(at_rate(base_requests(spec), rate, spec), spec.mix, scale, spec.seed)
