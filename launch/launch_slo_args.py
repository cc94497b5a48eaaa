"""sglang-slo's own flags on the launcher's parser (SLO policy, GPU emulation, SLO-adaptive
speculation, router membership), and the KEY=VALUE parameters both launchers read."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR

SLO_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")  # SGLang's adaptive-capable workers
DEFAULT_SPEC_STEPS = "0,1,2,3,4"
EMULATED_DRAFT_RATIO = 0.1  # an EAGLE head (one layer + LM head) on Llama-3-8B reads ~10 % of its weights
# Policy parameters with their own flags: flag -> constructor parameter of the policies that take it.
POLICY_FLAGS = {
    "--slo-alpha": ("alpha", float, "service-gain degradation exponent α (Tempo Eq. 1-3)"),
    "--slo-reserve-share": ("reserve_share", float, "share of the batch reserved for best-effort work (Tempo)"),
    "--slo-fairness": ("fairness", float, "fairness blend f in (1-f)·priority + f·fair (Tempo, GMAX)"),
    "--slo-cutoff-p": ("cutoff", float, "cutoff p against the B-th priority (GMAX)"),
    "--slo-quanta": ("quantum_steps", int, "decode steps between preemption points (Tempo, LAS)"),
    "--slo-frame-length": ("frame_steps", int, "steps per preemption frame (GMAX)"),
    "--slo-aging-delta": ("aging_delta", float, "priority aging δ (GMAX)"),
}


def add_slo_args(parser: argparse.ArgumentParser) -> None:
    from scheduler.core.fairness import DEFAULT_TENANT_FAIRNESS
    from scheduler.core.policies import POLICIES
    from scheduler.core.slo import SloClass

    group = parser.add_argument_group("sglang-slo", "per-request SLOs and SLO-aware scheduling")
    group.add_argument(
        "--slo-policy",
        default="edf",
        choices=sorted(POLICIES),
        help="Scheduling policy of the waiting queue. 'fcfs' behaves exactly as stock SGLang.",
    )
    group.add_argument(
        "--slo-policy-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="A policy parameter (JSON value), repeatable, e.g. --slo-policy-param reserve_share=0.1",
    )
    for flag, (param, kind, text) in POLICY_FLAGS.items():
        group.add_argument(flag, type=kind, help=f"{text}; default per policy: {_defaults_of(param)}")
    group.add_argument(
        "--slo-batching",
        choices=("auto", "mixed", "separate"),
        default="auto",
        help="SLO policies only: 'mixed' puts prefill chunks into the decode batch (SGLang's "
        "--enable-mixed-chunk; the papers' batch model, and what the per-step chunk lever needs); "
        "'separate' keeps SGLang's prefill-only steps, where decodes wait for each prefill and the "
        "chunk lever is off. 'auto' (default): mixed on a GPU or an emulated one, separate on CPU, where "
        "mixed steps measured half the throughput (benchmarks/RESULTS.md). Speculative decoding runs separate.",
    )
    group.add_argument(
        "--slo-quantile",
        type=float,
        help="quantile of the length predictor's upper bound (default: the --slo-length-predictor's own)",
    )
    group.add_argument(
        "--slo-length-predictor",
        metavar="PATH|trained[:Q]|history[:Q]|history-len[:Q]|none",
        default=DEFAULT_LENGTH_PREDICTOR,
        help="output-length bound the SLO policies plan with, refined every N generated tokens: 'trained:Q' "
        f"(default {DEFAULT_LENGTH_PREDICTOR}: the Q-quantile of the answer's length given the prompt's, from a "
        "table trained on a public chat trace, until this server's recent answers bound better), 'history:Q' "
        "(the Q-quantile of this server's recent answer lengths alone, learned online, no training), 'history' "
        "(their mean), 'history-len[:Q]' (the same among answers to prompts within half an octave of its length "
        "first), 'none' (the client's max_new_tokens bounds every answer), a table (.json, "
        "benchmarks/predictor/train_length.py --out) or a saved predictor (scheduler.core.analyzer.train_cli --out).",
    )
    group.add_argument(
        "--slo-program-patterns",
        metavar="PATH",
        help="Seed patterns for compound stage sub-deadlines (JITServe deep-research JSON format); "
        "the server also learns from the programs it serves.",
    )
    group.add_argument(
        "--slo-perf-profile",
        metavar="PATH",
        help="GPU+model performance profile (scheduler/profiles/*.json format) used as is for batch caps "
        "and chunk sizes; without it the server learns a model from the iterations it measures.",
    )
    emulation = parser.add_argument_group(
        "GPU emulation", "run on CPU with the tiny model, every forward pass paced to a GPU+model profile"
    )
    emulation.add_argument(
        "--emulate-gpu",
        metavar="GPU",
        help="h100, a100, a40 (scheduler/profiles) or a profile .json of your own; sets the KV-cache "
        "capacity to the card's (--max-total-tokens), the model to tiny and the policies' perf model "
        "to the profile unless given; /slo/status reports late steps when the host cannot keep up",
    )
    emulation.add_argument(
        "--emulate-model", metavar="MODEL", default="llama3-8b", help="model of the profile (default llama3-8b)"
    )
    emulation.add_argument(
        "--emulate-slowdown",
        type=float,
        default=1.0,
        metavar="K",
        help="run the emulated card K times slower (dilated time) when the host cannot keep up with it; "
        "clients scale their SLOs by K (default 1: the card's own speed)",
    )
    emulation.add_argument(
        "--emulate-full-forward",
        action="store_true",
        help="run the tiny model's layers in every emulated step (tokens as a plain tiny server's; slow "
        "mixed steps); by default an emulated step skips them and only its logits are computed",
    )
    emulation.add_argument(
        "--emulate-draft-acceptance",
        type=float,
        default=0.8,
        metavar="A",
        help="emulated speculative decoding (the tiny target with tiny-draft, or tiny-eagle): the "
        "probability that a drafted token is accepted, drawn once per token and position "
        "(default 0.8, an EAGLE head's on Llama-3-8B)",
    )
    spec = parser.add_argument_group(
        "SLO-adaptive speculation", "with --speculative-algorithm EAGLE|EAGLE3|STANDALONE (SLOs-Serve §3.2.3)"
    )
    spec.add_argument(
        "--slo-speculation",
        action="store_true",
        help="choose the speculation length each batch from the running requests' TPOT tiers, the measured "
        "acceptance and the performance model (replaces SGLang's acceptance-only --speculative-adaptive)",
    )
    spec.add_argument(
        "--slo-spec-steps",
        default=DEFAULT_SPEC_STEPS,
        metavar="S1,S2,...",
        help=f"candidate speculation lengths, one runtime state each (default {DEFAULT_SPEC_STEPS}; 0 = no drafting)",
    )
    spec.add_argument(
        "--slo-spec-draft-ratio",
        type=float,
        metavar="R",
        help="a draft step's cost relative to the target's decode step (default: the measured draft/target "
        f"weight ratio; {EMULATED_DRAFT_RATIO} under --emulate-gpu, an EAGLE head on Llama-3-8B)",
    )
    spec.add_argument(
        "--slo-spec-margin",
        type=float,
        default=0.05,
        metavar="M",
        help="hysteresis: switch length only for a predicted gain above M (default 0.05), held for 4 passes; "
        "a length that would miss a TPOT another keeps is left at once",
    )
    router = parser.add_argument_group("router worker", "join an sglang-slo router's pool (python -m launch_router)")
    router.add_argument(
        "--router-address",
        metavar="ADDR",
        help="the router's worker address, e.g. tcp://127.0.0.1:30100: register there, report load and serve "
        "what it routes here (the HTTP API keeps serving direct clients too); --api-key is presented to it",
    )
    router.add_argument("--worker-id", help="name in the router's pool (default: <gpu>-<port>)")
    router.add_argument(
        "--worker-gpu", help="GPU kind reported to the router (default: the emulated card, else cpu or CUDA's name)"
    )
    router.add_argument(
        "--router-allow-remote",
        action="store_true",
        help="allow a router address that is not loopback (needs --router-curve-public-key: the link is encrypted)",
    )
    router.add_argument(
        "--router-curve-public-key",
        metavar="FILE",
        help="the router's CURVE public key (a zmq.auth .key file): the link to the router is encrypted; "
        "required for a router that is not loopback",
    )
    router.add_argument(
        "--worker-curve-secret-key",
        metavar="FILE",
        help="this worker's own CURVE key pair (.key_secret) for that link (default: an ephemeral one)",
    )
    router.add_argument(
        "--advertise-host",
        metavar="HOST",
        help="the address the router and PD peers reach this worker at (default: the address the router sees "
        "this worker connect from); a PD worker's KV transfer is announced there too (SGLANG_HOST_IP)",
    )
    add_worker_secret_args(
        router,
        "the router's worker credential (at least 16 bytes; prefer --worker-secret-file or "
        "$SGLANG_SLO_WORKER_SECRET, which ps cannot show): proved to the router when registering, and "
        "the router must prove it back before this worker takes any work",
    )
    router.add_argument(
        "--worker-tier-ms",
        type=float,
        metavar="MS",
        help="the TPOT tier (ms) this worker starts in under --routing-policy polyserve (e.g. a decode pool's tier)",
    )
    group.add_argument(
        "--slo-max-queued-tokens",
        type=int,
        metavar="N",
        help="bound on the prompt tokens of queued requests: beyond it a new request is answered at once with "
        "HTTP 429 queue_full and a Retry-After from the queue's predicted drain (SGLang's --max-queued-requests "
        "bounds their number the same way, here on PD workers too and under every policy)",
    )
    group.add_argument(
        "--slo-tenant-fairness",
        type=float,
        default=DEFAULT_TENANT_FAIRNESS,
        metavar="F",
        help="weight in [0, 1] of the fair-share blend between API keys (--auth-config shares): while several "
        "keys have requests waiting, the policy's order is blended with the order that serves each key in "
        f"proportion to its share (0: the policy's order alone; default {DEFAULT_TENANT_FAIRNESS})",
    )
    group.add_argument(
        "--slo-drain-timeout-s",
        type=float,
        default=30.0,
        metavar="S",
        help="graceful drain on SIGTERM: admit nothing new (503 draining; the router stops routing here), let "
        "requests in flight finish for up to S seconds, hand the rest back to the router, then exit (default 30; "
        "a second SIGTERM exits at once)",
    )
    group.add_argument("--slo-default-ttft-ms", type=float, help="TTFT for requests that carry no SLO.")
    group.add_argument("--slo-default-tpot-ms", type=float, help="Deadline-based TPOT for requests with no SLO.")
    group.add_argument("--slo-default-deadline-ms", type=float, help="End-to-end deadline for requests with no SLO.")
    group.add_argument(
        "--slo-default-class",
        choices=[c.value for c in SloClass],
        help="Class for requests with no SLO (default: inferred; best_effort when no target is set).",
    )


def _defaults_of(param: str) -> str:
    from scheduler.core.policies import POLICIES

    found = []
    for name in sorted(POLICIES):
        defaults = POLICIES.defaults(name)
        if param in defaults:
            found.append(f"{name}: {defaults[param]}")
    return ", ".join(found)


def json_params(items: list[str], flag: str, key: Callable[[str], str] | None = None) -> dict[str, Any]:
    """The KEY=VALUE values of `flag`; VALUE is JSON (a bare word is taken as a string). `key`
    maps each KEY of a pair (to normalise it, or to stop with a message for one it refuses)."""
    params: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if sep and key is not None:
            name = key(name)
        if not sep or not name:
            raise SystemExit(f"{flag}: expected KEY=VALUE, got {item!r}")
        try:
            params[name] = json.loads(raw)
        except json.JSONDecodeError:
            params[name] = raw
    return params


def add_worker_secret_args(group: Any, secret_help: str) -> None:
    """--worker-secret and --worker-secret-file, the router link's credential (router and workers)."""
    group.add_argument("--worker-secret", metavar="SECRET", help=secret_help)
    group.add_argument("--worker-secret-file", metavar="PATH", help="read --worker-secret from this file")
