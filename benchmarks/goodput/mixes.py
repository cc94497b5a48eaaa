"""The papers' SLO mixes: which class each request of a trace gets, and its targets.

Traces carry lengths and arrivals but no SLOs; each paper drew its own. A mix turns
``list[TraceRequest]`` into ``list[PlannedRequest]`` with SLO bodies in the server's field names
(``scheduler.core.slo``), so every policy is scored against the same targets.

Units: class shares are shares of *units* (a lone request, or a whole program), as the papers
count a compound request once however many calls it makes. Existing programs (deep research,
agent sessions) are never split: drawn compound, they get one program deadline; drawn otherwise,
each call gets that class's targets (the harness still sends them as their DAG). In a flat trace,
a unit drawn compound becomes a chain of 2-3 consecutive lone requests (``mix-<n>``).

Scaling: every target is written for the reference GPU (``reference_zero_load``). On a server
that is k times slower at zero load, the same targets would be k times harder, so ``Scale``
multiplies TTFT-type targets by measured/reference zero-load TTFT (for the request's prompt
length) and per-token and end-to-end targets by measured/reference TPOT, then by ``--slo-scale``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from typing import Any

from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.traces import TraceRequest
from scheduler.core.perf_model import load_perf_model, profile_path

# --------------------------------------------------------------------------------------------
# Zero-load speed: the reference GPU the mixes are written for, and the server under test

REFERENCE_GPU = "h100"
REFERENCE_MODEL = "llama3-8b"
REFERENCE_PROMPTS = tuple(2**k for k in range(4, 14))  # 16..8192 tokens: the TTFT line is fitted over these
REFERENCE_DECODE_CONTEXT = 1024  # KV tokens of the one decoding request: a short chat context


@dataclass(frozen=True)
class ZeroLoad:
    """A server's speed with one request in flight: TTFT = base + per-token x prompt, and TPOT.

    A line, because prefill cost is a fixed launch/weights-read part plus a per-token part, and
    two numbers per phase are all a short calibration run can measure reliably.
    """

    ttft_base_ms: float
    ttft_per_token_ms: float
    tpot_ms: float

    def __post_init__(self) -> None:
        for name in ("ttft_base_ms", "ttft_per_token_ms", "tpot_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be finite and >= 0, got {value}")
        if self.tpot_ms <= 0 or self.ttft_ms(1) <= 0:
            raise ValueError("zero-load TTFT and TPOT must be positive")

    def ttft_ms(self, prompt_tokens: int) -> float:
        return self.ttft_base_ms + self.ttft_per_token_ms * max(prompt_tokens, 1)

    def solo_ms(self, prompt_tokens: int, output_tokens: int) -> float:
        """End-to-end latency alone on the server: prefill, then one decode step per output token."""
        return self.ttft_ms(prompt_tokens) + output_tokens * self.tpot_ms

    @classmethod
    def fit(cls, ttft_points: Iterable[tuple[int, float]], tpot_ms: float) -> ZeroLoad:
        """Line through (prompt tokens, TTFT ms) minimising *relative* error, coefficients >= 0.

        Relative, because targets are scaled by ratios of two such lines: a 10 % miss at 16
        tokens matters as much as one at 8K, and a plain fit would trade the first for the second.
        """
        points = [(float(p), float(t)) for p, t in ttft_points]
        if not points or any(t <= 0 for _, t in points):
            raise ValueError("need at least one (prompt_tokens, ttft_ms) point, with ttft_ms > 0")
        w = [1.0 / (t * t) for _, t in points]
        s0 = sum(w)
        s1 = sum(wi * p for wi, (p, _) in zip(w, points))
        s2 = sum(wi * p * p for wi, (p, _) in zip(w, points))
        t0 = sum(wi * t for wi, (_, t) in zip(w, points))
        t1 = sum(wi * p * t for wi, (p, t) in zip(w, points))
        det = s0 * s2 - s1 * s1
        slope = (s0 * t1 - s1 * t0) / det if det > 1e-12 * s0 * s2 else 0.0
        base = (t0 - slope * s1) / s0
        if slope < 0:  # TTFT cannot fall with the prompt: noise, keep the level
            base, slope = t0 / s0, 0.0
        elif base < 0:  # nor can the launch cost be negative: refit through the origin
            base, slope = 0.0, t1 / s2
        return cls(ttft_base_ms=base, ttft_per_token_ms=slope, tpot_ms=tpot_ms)


class Calibration(ZeroLoad):
    """The *measured* zero-load speed of the server under test (same shape as the reference)."""


def reference_zero_load() -> ZeroLoad:
    """The GPU the papers' targets are written for: H100 SXM + Llama-3-8B, batch of one.

    From our shipped profile (``scheduler/profiles/h100-llama3-8b.json``, PolyServe-style table
    via ``scheduler.core.perf_model``): TTFT is one prefill step of the whole prompt fitted as a
    line over 16-8192 tokens by relative error (about 6.0 ms + 0.0208 ms/token, within 12 % of
    the table at every power of two); TPOT is one decode step of a single request at a 1024-token
    context (about 6.86 ms). The papers ran 7-8B models on A100/H100/H200
    class GPUs, so this is the closest profile we ship.
    """
    return profile_zero_load(REFERENCE_GPU, REFERENCE_MODEL)


@cache
def profile_zero_load(gpu: str, model: str = REFERENCE_MODEL) -> ZeroLoad:
    """Zero-load speed of a shipped GPU+model profile, measured the way the reference is."""
    perf = load_perf_model(profile_path(gpu, model), kind="table")
    points = [(p, 1000.0 * perf.step_time(p, 0, p)) for p in REFERENCE_PROMPTS]
    tpot = 1000.0 * perf.step_time(0, 1, REFERENCE_DECODE_CONTEXT)
    return ZeroLoad.fit(points, tpot)


@dataclass(frozen=True)
class Scale:
    """How much looser than on the reference GPU every target is: calibration x ``number``.

    End-to-end deadlines (deadline and compound classes) scale with the per-token factor: a 20 s
    answer is mostly decode steps, and the papers' E2E targets come from decode-dominated calls.
    """

    number: float = 1.0  # the --slo-scale number; 1 = the papers' targets (after calibration)
    calibration: Calibration | None = None
    reference: ZeroLoad = field(default_factory=reference_zero_load)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.number) and self.number > 0):
            raise ValueError(f"SLO scale must be finite and > 0, got {self.number}")

    @classmethod
    def from_option(cls, option: str | float, calibration: Calibration | None = None) -> Scale:
        """``--slo-scale``: "auto" = the calibration alone; a number = calibration (if any) x number."""
        if isinstance(option, str) and option.strip().lower() == "auto":
            if calibration is None:
                raise ValueError("--slo-scale auto needs a calibration of the server under test")
            return cls(1.0, calibration)
        try:
            number = float(option)
        except ValueError:
            raise ValueError(f"--slo-scale must be 'auto' or a number, got {option!r}") from None
        return cls(number, calibration)

    @property
    def zero_load(self) -> ZeroLoad:
        """Zero-load speed of the server the targets are for (before ``number``)."""
        return self.calibration if self.calibration is not None else self.reference

    def ttft_factor(self, prompt_tokens: int) -> float:
        """Per prompt length, since the two servers' fixed and per-token prefill costs differ."""
        ratio = self.zero_load.ttft_ms(prompt_tokens) / self.reference.ttft_ms(prompt_tokens)
        return self.number * ratio

    @property
    def tpot_factor(self) -> float:
        return self.number * self.zero_load.tpot_ms / self.reference.tpot_ms

    def zero_load_ttft_ms(self, prompt_tokens: int) -> float:
        return self.number * self.zero_load.ttft_ms(prompt_tokens)

    def solo_ms(self, prompt_tokens: int, output_tokens: int) -> float:
        return self.number * self.zero_load.solo_ms(prompt_tokens, output_tokens)


# --------------------------------------------------------------------------------------------
# SLO bodies, one function per class of each paper

Body = dict[str, Any]
Drawer = Callable[[TraceRequest, random.Random, Scale], Body]


def _ms(value: float) -> float:
    """0.1 ms resolution; never 0, which parse_slo rejects."""
    return max(round(value, 1), 0.1)


def _latency(ttft_ms: float, tpot_ms: float, req: TraceRequest, scale: Scale) -> Body:
    return {
        "class": "latency",
        "ttft_ms": _ms(ttft_ms * scale.ttft_factor(req.prompt_tokens)),
        "tpot_ms": _ms(tpot_ms * scale.tpot_factor),
    }


def _deadline(deadline_ms: float, scale: Scale) -> Body:
    return {"class": "deadline", "deadline_ms": _ms(deadline_ms * scale.tpot_factor)}


# Tempo §6.1 / JITServe §6.1: P95 of 1K DeepSeek API calls.
TEMPO_TTFT_MS, TEMPO_TBT_MS, TEMPO_DEADLINE_MS = 2000.0, 100.0, 20_000.0


def _tempo_latency(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    return _latency(TEMPO_TTFT_MS, TEMPO_TBT_MS, req, scale)


def _tempo_deadline(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    return _deadline(TEMPO_DEADLINE_MS, scale)


# PolyServe §5: TTFT uniform over three values, TPOT tiers 10/20/30/40 %.
POLYSERVE_TTFT_MS = (300.0, 500.0, 1000.0)
POLYSERVE_TPOT_TIERS = ((20.0, 0.1), (30.0, 0.2), (50.0, 0.3), (100.0, 0.4))


def _polyserve(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    ttft = rng.choice(POLYSERVE_TTFT_MS)
    tpot = rng.choices([t for t, _ in POLYSERVE_TPOT_TIERS], [w for _, w in POLYSERVE_TPOT_TIERS])[0]
    return _latency(ttft, tpot, req, scale)


# SLOs-Serve Tab. 1: tight = 3x zero-load TTFT and 50 ms TPOT, loose = 5x and 100 ms (paired).
SLOS_TIGHT, SLOS_LOOSE = (3.0, 50.0), (5.0, 100.0)
SLOS_SERVE_TIERS = (SLOS_TIGHT, SLOS_LOOSE)


def _slos_tier(slowdown: float, tpot: float, req: TraceRequest, scale: Scale) -> Body:
    return {
        "class": "latency",
        "ttft_ms": _ms(slowdown * scale.zero_load_ttft_ms(req.prompt_tokens)),
        "tpot_ms": _ms(tpot * scale.tpot_factor),
    }


def _slos_serve(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    return _slos_tier(*rng.choice(SLOS_SERVE_TIERS), req, scale)


def _slos_app(ttft_slowdown: float, tpot_ms: float) -> Drawer:
    """One application of SLOs-Serve Tab. 1/2: ChatBot is loose on prefill and decode, Coder
    loose on prefill and tight on decode, Summarizer tight on prefill and loose on decode.
    Reasoning is tight on prefill, thinking and response alike: its response SLO is loose, but
    the server sees one decode stream and takes a request's tightest decode SLO (§3.2.1)."""
    return lambda req, rng, scale: _slos_tier(ttft_slowdown, tpot_ms, req, scale)


# GoodServe §5: E2E deadline = relaxation x solo latency (the paper uses 1, 1.5, ..., 3).
GOODSERVE_RELAX = (1.0, 3.0)


def _goodserve(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    relax = rng.uniform(*GOODSERVE_RELAX)
    return {"class": "deadline", "deadline_ms": _ms(relax * scale.solo_ms(req.prompt_tokens, req.output_tokens))}


def _no_slo(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    return {}


# A chat service: interactive answers streamed at reading speed (TTFT 1 s, TPOT 50 ms), some
# jobs due in Tempo's 20 s, and best-effort traffic (no SLO) that must not starve. It is the
# mix with best-effort requests, which exercise Tempo's reserve (§4.3).
CHAT_TTFT_MS, CHAT_TPOT_MS = 1000.0, 50.0


def _chat_latency(req: TraceRequest, rng: random.Random, scale: Scale) -> Body:
    return _latency(CHAT_TTFT_MS, CHAT_TPOT_MS, req, scale)


# --------------------------------------------------------------------------------------------
# Registry


@dataclass(frozen=True)
class Mix:
    """Unit shares per class, and how one call of each non-compound class gets its targets."""

    shares: Mapping[str, float]
    bodies: Mapping[str, Drawer]
    stage_deadline_ms: float = 0.0  # compound: program deadline per stage of DAG depth (reference GPU)

    def __post_init__(self) -> None:
        drawn = set(self.shares) - {"compound"}
        if drawn != set(self.bodies):
            raise ValueError(f"classes {sorted(drawn)} need exactly one body drawer each")
        if ("compound" in self.shares) != (self.stage_deadline_ms > 0):
            raise ValueError("a compound share needs a per-stage deadline, and only then")


MIXES: dict[str, Mix] = {
    "tempo": Mix(
        {"latency": 3, "deadline": 1, "compound": 1},
        {"latency": _tempo_latency, "deadline": _tempo_deadline},
        TEMPO_DEADLINE_MS,
    ),
    "jitserve": Mix(
        {"latency": 1, "deadline": 1, "compound": 1},
        {"latency": _tempo_latency, "deadline": _tempo_deadline},
        TEMPO_DEADLINE_MS,
    ),
    "polyserve": Mix({"latency": 1}, {"latency": _polyserve}),
    "slos-serve": Mix({"latency": 1}, {"latency": _slos_serve}),
    "slos-chatbot": Mix({"latency": 1}, {"latency": _slos_app(SLOS_LOOSE[0], SLOS_LOOSE[1])}),
    "slos-coder": Mix({"latency": 1}, {"latency": _slos_app(SLOS_LOOSE[0], SLOS_TIGHT[1])}),
    "slos-summarizer": Mix({"latency": 1}, {"latency": _slos_app(SLOS_TIGHT[0], SLOS_LOOSE[1])}),
    "slos-reasoning": Mix({"latency": 1}, {"latency": _slos_app(SLOS_TIGHT[0], SLOS_TIGHT[1])}),
    # ChatBot's TTFT with a TPOT tight enough that decoding, not prefill, may bind (issue #48:
    # where SLO-adaptive speculation is meant to pay); H100 TPOTs, scaled to the card like every mix
    "slos-chat-tight": Mix({"latency": 1}, {"latency": _slos_app(SLOS_LOOSE[0], 20.0)}),
    "slos-chat-tight10": Mix({"latency": 1}, {"latency": _slos_app(SLOS_LOOSE[0], 10.0)}),
    "goodserve": Mix({"deadline": 1}, {"deadline": _goodserve}),
    "chat": Mix(
        {"latency": 6, "deadline": 2, "none": 2},
        {"latency": _chat_latency, "deadline": _tempo_deadline, "none": _no_slo},
    ),
    "none": Mix({"none": 1}, {"none": _no_slo}),
}
CHAIN_LENGTHS = (2, 3)  # calls per synthetic compound program in a flat trace


def get_mix(name: str) -> Mix:
    if name not in MIXES:
        raise ValueError(f"unknown SLO mix {name!r}; valid: {', '.join(MIXES)}")
    return MIXES[name]


# --------------------------------------------------------------------------------------------
# Units, chains and programs


def _units(requests: Iterable[TraceRequest]) -> list[list[TraceRequest]]:
    """Lone requests and whole programs, in order of first appearance."""
    units: list[list[TraceRequest]] = []
    by_program: dict[str, list[TraceRequest]] = {}
    for r in requests:
        if r.program_id is None:
            units.append([r])
        elif r.program_id in by_program:
            by_program[r.program_id].append(r)
        else:
            by_program[r.program_id] = [r]
            units.append(by_program[r.program_id])
    return units


def _chain(members: Sequence[TraceRequest], program_id: str) -> list[TraceRequest]:
    """Consecutive lone requests as one sequential program, all sent from the first's arrival."""
    out: list[TraceRequest] = []
    for k, r in enumerate(members):
        out.append(
            replace(
                r,
                program_id=program_id,
                stage=k,
                parents=(out[-1].rid,) if out else (),
                arrival_s=members[0].arrival_s,
                think_s=0.0,
            )
        )
    return out


def dag_depth(program: Sequence[TraceRequest]) -> int:
    """Calls on the program's longest dependency path: its stages in time (parallel calls count once)."""
    by_rid = {r.rid: r for r in program}
    depth: dict[str, int] = {}
    for r in program:
        path, on_path = [r.rid], {r.rid}  # depth-first, one parent at a time: `path` is the walk
        while path:
            rid = path[-1]
            parents = [p for p in by_rid[rid].parents if p in by_rid]
            pending = next((p for p in parents if p not in depth), None)
            if pending is not None:
                if pending in on_path:
                    raise ValueError(f"program {r.program_id!r} has a dependency cycle at {pending!r}")
                path.append(pending)
                on_path.add(pending)
                continue
            depth[rid] = 1 + max((depth[p] for p in parents), default=0)
            on_path.discard(rid)
            path.pop()
    return max(depth.values(), default=1)


def _compound(program: Sequence[TraceRequest], mix: Mix, scale: Scale) -> list[PlannedRequest]:
    deadline = _ms(mix.stage_deadline_ms * dag_depth(program) * scale.tpot_factor)
    planned = []
    for k, r in enumerate(program):
        assert r.program_id is not None
        body = {
            "class": "compound",
            "deadline_ms": deadline,
            "program_id": r.program_id,
            "stage": r.stage if r.stage is not None else k,
        }
        planned.append(PlannedRequest(r, "compound", body, program_deadline_ms=deadline))
    return planned


def apply_mix(requests: Sequence[TraceRequest], mix: str, scale: Scale, seed: int) -> list[PlannedRequest]:
    """Every request with its class and SLO body, sorted by arrival; the same for the same seed.

    A flat-trace unit drawn compound takes the next 2-3 lone requests (fewer at the trace's end);
    every input rid appears exactly once in the output.
    """
    spec = get_mix(mix)
    rng = random.Random(seed)
    classes, weights = list(spec.shares), list(spec.shares.values())
    units = _units(requests)
    lone = [i for i, u in enumerate(units) if u[0].program_id is None]
    next_lone = 0  # position in `lone` of the first lone unit not yet planned
    taken = [False] * len(units)
    chains = 0
    planned: list[PlannedRequest] = []
    for i, unit in enumerate(units):
        if taken[i]:
            continue
        taken[i] = True
        is_lone = unit[0].program_id is None
        if is_lone:
            next_lone += 1  # units before i are all planned, and chains only take lone units after i
        cls = rng.choices(classes, weights)[0]
        if cls != "compound":
            planned.extend(PlannedRequest(r, cls, spec.bodies[cls](r, rng, scale)) for r in unit)
            continue
        if is_lone:
            extra = lone[next_lone : next_lone + rng.choice(CHAIN_LENGTHS) - 1]
            next_lone += len(extra)
            for j in extra:
                taken[j] = True
            unit = _chain(unit + [units[j][0] for j in extra], f"mix-{chains}")
            chains += 1
        planned.extend(_compound(unit, spec, scale))
    return sorted(planned, key=lambda p: p.req.arrival_s)
