"""How many prefill and decode instances the live request mix wants (SLOs-Serve, Appendix A),
generalised from one TPOT to PolyServe's TPOT tiers.

Why: with prefill/decode disaggregation the best split of devices between the stages depends on
the mix (prompt vs. answer lengths) *and* on the TPOTs, so it drifts with the traffic; the
router sees every arrival and completion and can publish the split the current mix wants, for
an operator or an autoscaler to act on.

The model (SLOs-Serve App. A, ideal scaling, prefill devices at full throughput): one step of a
decode batch of n requests takes BatchTime(n) = n / MaxTokenTpt + C. A decode device of tier k
keeps BatchTime ≤ TPOT_k, so it holds (TPOT_k − C)·MaxTokenTpt requests, and a tier-k request
occupies a slot for O·TPOT_k seconds. With arrival rate λ_k, E[I_k] prompt and E[O_k] output
tokens, the devices needed at the current load are

    n_prefill  = Σ_k λ_k E[I_k] / MaxTokenTpt
    n_decode_k = λ_k E[O_k] · TPOT_k / (TPOT_k − C) / MaxTokenTpt      (one decode pool per tier)

so the optimal ratio n_prefill / n_decode = Σ λ_k E[I_k] / Σ λ_k E[O_k]·TPOT_k/(TPOT_k − C), and the
per-device goodput bound (Eq. 4, mix-weighted over tiers) is

    g* = MaxTokenTpt / (E_r[I_r] + E_r[O_r · TPOT_r / (TPOT_r − C)])   requests/s per device.

A tier whose TPOT is at most C cannot be met even by a batch of one: it is reported as
infeasible and left out of every sum. Requests without a TPOT are sized with a default TPOT.

Two optional refinements, both off when their inputs are not given (then the numbers are App.
A's exactly): a separate prefill throughput (`prefill_tpt`; derived from a perf model, since a
decode token's marginal cost includes reading its context's KV and a prefill token's does not,
so one constant would over-count prefill devices several-fold at long contexts), and a KV-cache
cap (`kv_capacity_tokens`; paper 003 §3.4: B_dc·(p + d/2) < C_kv), which binds before the TPOT
does on loose tiers: slots per decode instance = min((TPOT − C)·MaxTokenTpt, C_kv / (I + O/2)).
With either, ratio = n_prefill / n_decode and g* = λ / (n_prefill + n_decode) from the same
device counts.

Pure: no ZMQ, HTTP or SGLang; the caller feeds `MixTracker` and calls `pd_sizing`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.core.perf_model import PerfModel

DEFAULT_WINDOW_S = 60.0
DEFAULT_TPOT_MS = 100.0  # requests without a TPOT, when no tier is known to borrow from
PROBE_BATCH = 256  # decode batch at which the per-token cost is measured (see perf_constants)
PROBE_PREFILL_TOKENS = 2048  # prefill chunk at which a prefill device's throughput is measured
NO_TPOT = "no_tpot"  # tier label of requests without a TPOT
TIER_STEPS = (1.0, 1.25, 1.6, 2.0, 2.5, 3.2, 4.0, 5.0, 6.3, 8.0)  # tpot_tier's grid within a decade
MIN_TIER_MS, MAX_TIER_MS = 1.0, 100_000.0


@dataclass(frozen=True)
class TierMix:
    """One tier's share of the window: λ (req/s) and mean lengths.

    `mean_output` is None when no request of the tier finished inside the window: outputs are
    only ever taken from observed completions (a client's max_new_tokens is a cap, not a
    length), so a tier with arrivals but no completions yet has no output estimate of its own.
    """

    tier_ms: float | None
    rate_rps: float
    mean_input: float | None
    mean_output: float | None
    arrivals: int
    finished: int


class MixTracker:
    """Sliding-window arrival and completion statistics per TPOT tier.

    The router calls `on_arrival` when it admits a request and `on_finished` when one completes,
    with the request's TPOT tier in ms (None: no TPOT) and a monotonic `now`. Events older than
    `window_s` are dropped. Rates divide by the time actually observed, min(window_s, now − start)
    (floored at `min_span_s`), so the first minute after start-up is not under-counted; `start` is
    the first event unless given.
    """

    def __init__(self, window_s: float = DEFAULT_WINDOW_S, start: float | None = None, min_span_s: float = 1.0) -> None:
        if not window_s > 0:
            raise ValueError("window_s must be > 0")
        self.window_s = float(window_s)
        self.min_span_s = float(min_span_s)
        self._start = start
        self._arrivals: dict[float | None, deque[tuple[float, int]]] = {}
        self._finished: dict[float | None, deque[tuple[float, int]]] = {}

    @staticmethod
    def _key(tier_ms: float | None) -> float | None:
        return None if tier_ms is None else float(tier_ms)

    def _record(
        self, events: dict[float | None, deque[tuple[float, int]]], tier_ms: float | None, tokens: int, now: float
    ) -> None:
        if self._start is None:
            self._start = now
        events.setdefault(self._key(tier_ms), deque()).append((now, max(int(tokens), 0)))
        self._expire(now)

    def on_arrival(self, tier_ms: float | None, prompt_tokens: int, now: float) -> None:
        self._record(self._arrivals, tier_ms, prompt_tokens, now)

    def on_finished(self, tier_ms: float | None, output_tokens: int, now: float) -> None:
        self._record(self._finished, tier_ms, output_tokens, now)

    def _expire(self, now: float) -> None:
        horizon = now - self.window_s
        for events in (self._arrivals, self._finished):
            for key in list(events):
                q = events[key]
                while q and q[0][0] < horizon:
                    q.popleft()
                if not q:
                    del events[key]

    def span_s(self, now: float) -> float:
        """Seconds the rates are averaged over."""
        observed = self.window_s if self._start is None else min(self.window_s, now - self._start)
        return max(observed, self.min_span_s)

    def snapshot(self, now: float) -> dict[float | None, TierMix]:
        """Per-tier mix over the window ending at `now` (tiers with any event in the window)."""
        self._expire(now)
        span = self.span_s(now)
        out: dict[float | None, TierMix] = {}
        for key in set(self._arrivals) | set(self._finished):
            arr = self._arrivals.get(key, ())
            fin = self._finished.get(key, ())
            out[key] = TierMix(
                tier_ms=key,
                rate_rps=len(arr) / span,
                mean_input=sum(t for _, t in arr) / len(arr) if arr else None,
                mean_output=sum(t for _, t in fin) / len(fin) if fin else None,
                arrivals=len(arr),
                finished=len(fin),
            )
        return out

    def pooled_mean_output(self, now: float) -> float | None:
        """Mean output over every completion in the window (the fallback for tiers without one)."""
        self._expire(now)
        tokens = [t for q in self._finished.values() for _, t in q]
        return sum(tokens) / len(tokens) if tokens else None


def perf_constants(
    perf: PerfModel, kv_tokens_per_req: float = 0.0, probe_batch: int = PROBE_BATCH
) -> tuple[float, float]:
    """(C, MaxTokenTpt) of App. A's BatchTime(n) = n / MaxTokenTpt + C, read off a step-time model.

    C is the step time of a one-request decode batch (weights are read once per step whatever the
    batch: the fixed cost). The per-token cost is the secant slope of decode step time between 1
    and `probe_batch` requests, each holding `kv_tokens_per_req` KV tokens (decode attention makes
    it grow with context; pass the mix's mean context). A roofline is piecewise linear, so the
    secant is the straight line through a realistic operating range rather than the slope of
    whichever term dominates at one end.
    """
    if probe_batch < 2:
        raise ValueError("probe_batch must be >= 2")
    kv = max(float(kv_tokens_per_req), 0.0)
    c = float(perf.step_time(0, 1, int(round(kv))))
    big = float(perf.step_time(0, probe_batch, int(round(kv * probe_batch))))
    per_token = (big - c) / (probe_batch - 1)
    if not (c >= 0 and per_token > 0 and math.isfinite(per_token)):
        raise ValueError(f"step-time model gives no positive per-token cost (C={c}, slope={per_token})")
    return c, 1.0 / per_token


def prefill_throughput(perf: PerfModel, chunk_tokens: int = PROBE_PREFILL_TOKENS) -> float:
    """Prompt tokens/s of a prefill-only device running `chunk_tokens` chunks back to back (its
    attention reads about the chunk's own KV)."""
    t = float(perf.step_time(chunk_tokens, 0, chunk_tokens))
    if not t > 0:
        raise ValueError(f"step-time model gives no positive prefill time for {chunk_tokens} tokens")
    return chunk_tokens / t


def tpot_tier(tpot_ms: float | None) -> float | None:
    """A client's TPOT snapped down onto a fixed log grid (ten steps a decade, MIN..MAX_TIER_MS):
    tiers keyed by the raw number would let each client mint new tracker keys and metric labels
    at will. Down, so a tier is never looser than the requests in it."""
    if tpot_ms is None:
        return None
    x = min(max(float(tpot_ms), MIN_TIER_MS), MAX_TIER_MS)
    decade = 10.0 ** math.floor(math.log10(x))
    step = max(s for s in TIER_STEPS if s * decade <= x * (1.0 + 1e-9))
    return round(step * decade, 6)


def _label(tier_ms: float | None) -> str:
    return NO_TPOT if tier_ms is None else f"{tier_ms:g}"


def pd_sizing(
    mix: Mapping[float | None, TierMix] | Iterable[TierMix],
    perf: PerfModel | None = None,
    *,
    overhead_s: float | None = None,
    max_token_tpt: float | None = None,
    prefill_tpt: float | None = None,
    kv_capacity_tokens: float | None = None,
    default_tpot_ms: float | None = None,
    fallback_output: float | None = None,
    probe_batch: int = PROBE_BATCH,
) -> dict[str, Any]:
    """App. A's prefill:decode sizing for `mix` (e.g. `MixTracker.snapshot(now)`), as a JSON-able dict.

    Constants: `overhead_s` (C) and `max_token_tpt` when given, else from `perf` via
    `perf_constants` at the mix's mean decode context E[I] + E[O]/2 (paper 003 §3.4: a decode
    request holds on average its prompt plus half its answer). `prefill_tpt` when given, else
    `prefill_throughput(perf)` with a model, else `max_token_tpt` (App. A's single constant).
    `kv_capacity_tokens` (None: unbounded, App. A's form) caps a decode instance's requests at
    capacity / (E[I_k] + E[O_k]/2). Requests without a TPOT are sized at `default_tpot_ms`, else
    the loosest TPOT tier in the mix, else DEFAULT_TPOT_MS. A tier without completions in the
    window uses `fallback_output` (e.g. `MixTracker.pooled_mean_output`); with neither it is
    listed under `no_output`: its prefill still counts, its decode and goodput do not.

    Keys: window inputs `overhead_s`, `max_token_tpt`, `prefill_tpt`, `kv_tokens_per_req` (None
    when no model was probed), `kv_capacity_tokens`, `default_tpot_ms`; `tiers` (label → tpot_ms,
    rate_rps, mean_input, mean_output, sized_output (the output length used: observed or the
    fallback), arrivals, finished, feasible, decode_factor =
    TPOT/(TPOT − C), slots_per_instance, memory_bound, prefill_instances, decode_instances);
    `infeasible_tiers` and `no_output` (labels); `prefill_tps` / `decode_tps` (prompt / output
    tokens per second offered by the sized tiers); `ratio` (n_prefill / n_decode, None without
    decode demand); `prefill_instances`, `decode_instances`, `instances` (fractional devices at
    the current load); `goodput_per_device_rps` (g*, None without sizeable traffic).
    """
    tiers = list(mix.values()) if isinstance(mix, Mapping) else list(mix)
    tpots = [t.tier_ms for t in tiers if t.tier_ms is not None]
    if default_tpot_ms is None:
        default_tpot_ms = max(tpots) if tpots else DEFAULT_TPOT_MS

    def output_of(t: TierMix) -> float | None:
        return t.mean_output if t.mean_output is not None else fallback_output

    def context_of(t: TierMix) -> float:
        return (t.mean_input or 0.0) + (output_of(t) or 0.0) / 2

    context: float | None = None
    if overhead_s is None or max_token_tpt is None:
        if perf is None:
            raise ValueError("pd_sizing needs a perf model or both overhead_s and max_token_tpt")
        weight = sum(t.rate_rps for t in tiers)
        context = sum(t.rate_rps * context_of(t) for t in tiers) / weight if weight > 0 else 0.0
        c, tpt = perf_constants(perf, context, probe_batch)
        overhead_s = c if overhead_s is None else overhead_s
        max_token_tpt = tpt if max_token_tpt is None else max_token_tpt
    if prefill_tpt is None:
        prefill_tpt = prefill_throughput(perf) if perf is not None else max_token_tpt
    if not (max_token_tpt > 0 and prefill_tpt > 0):
        raise ValueError("max_token_tpt and prefill_tpt must be > 0")

    out_tiers: dict[str, dict[str, Any]] = {}
    infeasible: list[str] = []
    no_output: list[str] = []
    prefill_tps = decode_tps = prefill_n = decode_n = 0.0
    sized_rate = sized_n = 0.0  # traffic with both stages sized, and its devices: g*
    for t in sorted(tiers, key=lambda t: (t.tier_ms is None, t.tier_ms or 0.0)):
        label = _label(t.tier_ms)
        tpot_s = (t.tier_ms if t.tier_ms is not None else default_tpot_ms) / 1000.0
        feasible = tpot_s > overhead_s
        o = output_of(t)
        entry: dict[str, Any] = {
            "tpot_ms": tpot_s * 1000.0,
            "rate_rps": t.rate_rps,
            "mean_input": t.mean_input,
            "mean_output": t.mean_output,
            "sized_output": o if feasible else None,
            "arrivals": t.arrivals,
            "finished": t.finished,
            "feasible": feasible,
            "decode_factor": tpot_s / (tpot_s - overhead_s) if feasible else None,
            "slots_per_instance": None,
            "memory_bound": False,
            "prefill_instances": 0.0,
            "decode_instances": 0.0,
        }
        out_tiers[label] = entry
        if not feasible:
            infeasible.append(label)
            continue
        p_n = t.rate_rps * (t.mean_input or 0.0) / prefill_tpt
        entry["prefill_instances"] = p_n
        prefill_tps += t.rate_rps * (t.mean_input or 0.0)
        prefill_n += p_n
        if o is None:
            if t.rate_rps > 0:
                no_output.append(label)
            continue
        # Little's law: λ·O·TPOT requests decode at once; an instance holds `slots` of them.
        slots = (tpot_s - overhead_s) * max_token_tpt
        ctx = context_of(t)
        if kv_capacity_tokens is not None and ctx > 0 and kv_capacity_tokens / ctx < slots:
            slots, entry["memory_bound"] = kv_capacity_tokens / ctx, True
        # A memory-bound batch steps faster than the TPOT: a request holds its slot for O steps
        # of BatchTime(slots) = slots / MaxTokenTpt + C, not O·TPOT.
        step_s = min(tpot_s, slots / max_token_tpt + overhead_s)
        d_n = t.rate_rps * o * step_s / slots
        entry["slots_per_instance"] = slots
        entry["decode_instances"] = d_n
        decode_tps += t.rate_rps * o
        decode_n += d_n
        sized_rate += t.rate_rps
        sized_n += p_n + d_n
    return {
        "overhead_s": overhead_s,
        "max_token_tpt": max_token_tpt,
        "prefill_tpt": prefill_tpt,
        "kv_tokens_per_req": context,
        "kv_capacity_tokens": kv_capacity_tokens,
        "default_tpot_ms": default_tpot_ms,
        "tiers": out_tiers,
        "infeasible_tiers": infeasible,
        "no_output": no_output,
        "prefill_tps": prefill_tps,
        "decode_tps": decode_tps,
        "ratio": prefill_n / decode_n if decode_n > 0 else None,
        "prefill_instances": prefill_n,
        "decode_instances": decode_n,
        "instances": prefill_n + decode_n,
        "goodput_per_device_rps": sized_rate / sized_n if sized_n > 0 else None,
    }


def tracker_sizing(tracker: MixTracker, now: float, perf: PerfModel | None = None, **kw: Any) -> dict[str, Any]:
    """`pd_sizing` of the tracker's window at `now`, tiers without completions falling back to
    the pooled mean output; adds `window_s` and `span_s`."""
    kw.setdefault("fallback_output", tracker.pooled_mean_output(now))
    out = pd_sizing(tracker.snapshot(now), perf, **kw)
    return {"window_s": tracker.window_s, "span_s": tracker.span_s(now), **out}


def profile_inputs(gpu: str, model: str = "llama3-8b") -> tuple[Any, int | None]:
    """(roofline model, KV-token capacity) of a shipped profile (scheduler/profiles), for
    `pd_sizing(..., perf, kv_capacity_tokens=...)`."""
    from scheduler.core.perf_model import RooflinePerfModel, load_profile, profile_path

    profile = load_profile(profile_path(gpu, model))
    return RooflinePerfModel.from_profile(profile), profile.get("kv_token_capacity")


def split_devices(sizing: Mapping[str, Any], total: int) -> dict[str, Any]:
    """Whole devices for a cluster of `total`: {"prefill": n, "decode": {tier label: n}}.

    Largest remainder over the demands (prefill and each tier's decode), then at least one
    prefill and one decode device when total ≥ 2 and both stages have demand (a stage with no
    device serves nothing). All prefill when there is no decode demand, zeros without demand.
    """
    if total < 0:
        raise ValueError("total must be >= 0")
    demand = {"prefill": float(sizing["prefill_instances"])}
    for label, t in sizing["tiers"].items():
        if t["decode_instances"] > 0:
            demand[label] = float(t["decode_instances"])
    whole = sum(demand.values())
    if whole <= 0:
        return {"prefill": 0, "decode": {}}
    shares = {k: total * v / whole for k, v in demand.items()}
    counts = {k: int(math.floor(s)) for k, s in shares.items()}
    for k in sorted(shares, key=lambda k: counts[k] - shares[k])[: total - sum(counts.values())]:
        counts[k] += 1
    decode_keys = [k for k in counts if k != "prefill"]
    if total >= 2 and demand["prefill"] > 0 and decode_keys:
        if counts["prefill"] == 0:
            counts[max(decode_keys, key=lambda k: counts[k])] -= 1
            counts["prefill"] = 1
        if sum(counts[k] for k in decode_keys) == 0:
            counts["prefill"] -= 1
            counts[max(decode_keys, key=lambda k: demand[k])] = 1
    return {"prefill": counts.pop("prefill"), "decode": counts}
