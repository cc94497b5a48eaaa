"""`python -m launch_server`: SGLang's server with per-request SLOs and SLO scheduling.

Takes every SGLang flag plus ours. With no --model-path it serves the embedded default model
(SmolLM2-135M-Instruct, no download); `--model-path tiny` serves the tiny random test model.
On a machine without CUDA it applies the CPU settings SGLang needs (each one can be overridden
by passing the flag yourself).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, predictor_from_spec
from server.cpu_support import activate

# Flags (and values) the CPU engine needs unless the user passed them.
CPU_DEFAULTS: list[tuple[str, str | None]] = [
    ("--device", "cpu"),
    ("--attention-backend", "torch_native"),
    ("--disable-cuda-graph", None),
    ("--skip-server-warmup", None),
    ("--dtype", "float32"),
    ("--mem-fraction-static", "0.05"),
    ("--max-total-tokens", "16384"),
    ("--sleep-on-idle", None),
]
# PD disaggregation on CPU (../shared/notes: PD section): Mooncake over TCP, one token per page
# (larger pages reach a Triton kernel).
CPU_PD_DEFAULTS: list[tuple[str, str | None]] = [
    ("--disaggregation-transfer-backend", "mooncake_tcp"),
    ("--page-size", "1"),
    # SGLang checks the KV pool against memory still free after loading; with a pool of servers
    # loading at once on one host 0.05 fails that check (measured; 0.3 passes, the KV pool itself
    # stays capped by --max-total-tokens).
    ("--mem-fraction-static", "0.3"),
]
# Environment the CPU PD path needs: the early cached-prefix send creates a torch.cuda.Event;
# servers must advertise loopback, not the external interface, for KV bootstrap.
# Speculative decoding on CPU (../shared/notes: speculative section): SGLang's intel_amx backend on
# our pure-torch ops (server/cpu_support/speculation.py); a draft model needs a larger pool share.
CPU_SPEC_DEFAULTS: list[tuple[str, str | None]] = [
    ("--attention-backend", "intel_amx"),
    ("--mem-fraction-static", "0.2"),
]
SLO_SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")  # SGLang's adaptive-capable workers
DEFAULT_SPEC_STEPS = "0,1,2,3,4"
DEFAULT_MAX_QUEUED_REQUESTS = 1024  # SGLang's --max-queued-requests through this launcher (0.5.17 has none)
EMULATED_DRAFT_RATIO = 0.1  # an EAGLE head (one layer + LM head) on Llama-3-8B reads ~10 % of its weights
CPU_PD_ENV = {"SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX": "0", "SGLANG_HOST_IP": "127.0.0.1"}
MODEL_ALIASES = ("default", "tiny", "tiny-gpu", "tiny-draft", "tiny-eagle", "tiny-eagle3")
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


def _has_flag(argv: list[str], *flags: str) -> bool:
    return any(a == f or a.startswith(f + "=") for a in argv for f in flags)


def _flag_value(argv: list[str], *flags: str) -> str | None:
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return None


def _wants_cpu(argv: list[str]) -> bool:
    device = _flag_value(argv, "--device")
    if device is not None:
        return device == "cpu"
    import torch

    return not torch.cuda.is_available()


def _resolve_model(argv: list[str]) -> list[str]:
    """Fill in or expand the model path: default (SmolLM2) or tiny, prepared on first use; the
    same aliases, plus the tiny target's drafts tiny-draft (STANDALONE), tiny-eagle (EAGLE) and
    tiny-eagle3 (EAGLE3), work for --speculative-draft-model-path."""
    from server.models import ensure_default_model

    if _flag_value(argv, "--model-path", "--model") is None:
        argv = argv + ["--model-path", str(ensure_default_model())]
    argv = _expand_alias(argv, ("--model-path", "--model"))
    return _expand_alias(argv, ("--speculative-draft-model-path",))


def _expand_alias(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    from server import models

    value = _flag_value(argv, *flags)
    if value not in MODEL_ALIASES:
        return argv
    build = {
        "default": models.ensure_default_model,
        "tiny": models.ensure_tiny_model,
        "tiny-gpu": models.ensure_tiny_gpu_model,  # head size and dtype GPU attention backends take
        "tiny-draft": models.ensure_tiny_draft_model,
        "tiny-eagle": models.ensure_tiny_eagle_model,  # --speculative-algorithm EAGLE
        "tiny-eagle3": models.ensure_tiny_eagle3_model,  # --speculative-algorithm EAGLE3
    }
    path = str(build[value]())
    out = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a in flags and i + 1 < len(argv):
            out += [a, path]
            skip = True
        elif a.startswith(tuple(f + "=" for f in flags)):
            out.append(a.split("=", 1)[0] + "=" + path)
        else:
            out.append(a)
    return out


def _with_defaults(argv: list[str], defaults: list[tuple[str, str | None]]) -> list[str]:
    extra: list[str] = []
    for flag, value in defaults:
        if not _has_flag(argv, flag):
            extra += [flag] if value is None else [flag, value]
    return argv + extra


def cpu_threads_binding(tp_size: int, cores: list[int], numa_nodes: int) -> str | None:
    """SGLANG_CPU_OMP_THREADS_BIND for `tp_size` ranks on CPU: SGLang binds one NUMA node per rank
    and refuses more ranks than nodes, so past that each rank gets its own share of `cores`
    ("0|1" on two cores). None: SGLang's per-node default fits, or there are too few cores."""
    if tp_size <= max(1, numa_nodes) or len(cores) < tp_size:
        return None
    cores = sorted(cores)
    share = len(cores) // tp_size
    groups = [cores[i * share : (i + 1) * share] for i in range(tp_size)]
    return "|".join(str(g[0]) if len(g) == 1 else f"{g[0]}-{g[-1]}" for g in groups)


def _numa_nodes() -> int:
    return len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))) or 1


def _with_cpu_defaults(argv: list[str]) -> list[str]:
    import os

    tp_size = int(_flag_value(argv, "--tp-size", "--tensor-parallel-size") or 1)
    binding = cpu_threads_binding(tp_size, sorted(os.sched_getaffinity(0)), _numa_nodes())
    if binding is not None:
        os.environ.setdefault("SGLANG_CPU_OMP_THREADS_BIND", binding)
    if _flag_value(argv, "--speculative-algorithm"):
        from server.cpu_support.speculation import enable_cpu_speculation

        enable_cpu_speculation()  # before ServerArgs are resolved: keeps intel_amx selected
        argv = _with_defaults(argv, CPU_SPEC_DEFAULTS)
    if _flag_value(argv, "--disaggregation-mode") in ("prefill", "decode"):
        import os

        for name, value in CPU_PD_ENV.items():
            os.environ.setdefault(name, value)
        argv = _with_defaults(argv, CPU_PD_DEFAULTS)  # before the CPU defaults: they win over those
    return _with_defaults(argv, CPU_DEFAULTS)


def _check_transfer_backend(backend: str) -> None:
    """Mooncake's engine is a separate wheel: say how to get it instead of failing in a child."""
    if not backend.startswith("mooncake"):
        return
    try:
        import mooncake.engine  # noqa: F401
    except ImportError as e:
        raise SystemExit(
            f"--disaggregation-transfer-backend {backend}: the Mooncake transfer engine is not importable ({e}); "
            "./slo setup installs it (mooncake-transfer-engine-non-cuda on CPU, plus libibverbs1/libnl-3-200/"
            "libnl-route-3-200 from Debian)"
        ) from None


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
        "--enable-mixed-chunk; the papers' batch model, and what the per-step chunk knob needs); "
        "'separate' keeps SGLang's prefill-only steps, where decodes wait for each prefill and the "
        "chunk knob is off. 'auto' (default): mixed on a GPU or an emulated one, separate on CPU, where "
        "mixed steps measured half the throughput (benchmarks/README.md). Speculative decoding runs separate.",
    )
    group.add_argument(
        "--slo-quantile",
        type=float,
        help="quantile of the length predictor's upper bound (default: the --slo-length-predictor's own)",
    )
    group.add_argument(
        "--slo-length-predictor",
        metavar="PATH|history[:Q]|history-len[:Q]|none",
        default=DEFAULT_LENGTH_PREDICTOR,
        help="output-length bound the SLO policies plan with, refined every N generated tokens: 'history:Q' "
        f"(default {DEFAULT_LENGTH_PREDICTOR}: the Q-quantile of this server's recent answer lengths, learned "
        "online, no training), 'history' (their mean), 'history-len[:Q]' (the same among answers to prompts "
        "within half an octave of its length first), 'none' (the client's max_new_tokens bounds every "
        "answer), or a saved predictor (scheduler.core.analyzer.train_cli --out).",
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
    router.add_argument(
        "--worker-secret",
        metavar="SECRET",
        help="the router's worker credential (at least 16 bytes; prefer --worker-secret-file or "
        "$SGLANG_SLO_WORKER_SECRET, which ps cannot show): proved to the router when registering, and "
        "the router must prove it back before this worker takes any work",
    )
    router.add_argument("--worker-secret-file", metavar="PATH", help="read --worker-secret from this file")
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


def _flag_params(args: argparse.Namespace) -> dict[str, Any]:
    """Policy parameters given through their own flags; a flag the policy lacks is an error."""
    from scheduler.core.policies import accepted_params

    accepted = accepted_params(args.slo_policy)
    params: dict[str, Any] = {}
    for flag, (param, _, _) in POLICY_FLAGS.items():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is None:
            continue
        if param not in accepted:
            raise SystemExit(f"{flag} does not apply to --slo-policy {args.slo_policy}")
        params[param] = value
    return params


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


def _default_slo(args: argparse.Namespace) -> dict[str, Any] | None:
    spec = {
        "ttft_ms": args.slo_default_ttft_ms,
        "tpot_ms": args.slo_default_tpot_ms,
        "deadline_ms": args.slo_default_deadline_ms,
        "class": args.slo_default_class,
    }
    spec = {k: v for k, v in spec.items() if v is not None}
    return spec or None


def _router_settings(
    args: argparse.Namespace,
    port: int,
    emulation: Any,
    on_cpu: bool,
    config_secret: bytes | None = None,
    client_key: str | None = None,
) -> dict[str, Any]:
    """The worker's identity in a router's pool; checked here so a typo stops start-up.
    `config_secret`: the worker key of --auth-config, the link's secret unless a flag gives one;
    `client_key`: the client API key (args.api_key unless given), the legacy stand-in for it."""
    if not args.router_address:
        if args.worker_id or args.worker_gpu or args.worker_tier_ms is not None or args.router_curve_public_key:
            raise SystemExit(
                "--worker-id/--worker-gpu/--worker-tier-ms/--router-curve-public-key: only with --router-address"
            )
        if args.worker_secret or args.worker_secret_file:
            raise SystemExit("--worker-secret/--worker-secret-file: only with --router-address")
        return {}
    if args.worker_tier_ms is not None and not args.worker_tier_ms > 0:
        raise SystemExit("--worker-tier-ms: must be > 0")
    from router.protocol import ProtocolError, check_worker_id
    from router.transport import CurveKeys, check_loopback, is_loopback

    try:
        check_loopback(args.router_address, args.router_allow_remote)
    except ValueError as e:
        raise SystemExit(f"--router-address: {e}") from None
    if args.router_curve_public_key:
        try:
            CurveKeys.for_worker(args.router_curve_public_key, args.worker_curve_secret_key)
        except ValueError as e:
            raise SystemExit(f"--router-curve-public-key/--worker-curve-secret-key: {e}") from None
    elif args.worker_curve_secret_key:
        raise SystemExit("--worker-curve-secret-key: only with --router-curve-public-key")
    elif not is_loopback(args.router_address):
        raise SystemExit(
            f"--router-address {args.router_address}: links that leave the machine are encrypted: give "
            "--router-curve-public-key (the router's .key file)"
        )
    gpu = args.worker_gpu or (emulation.name.split("/")[0] if emulation else "cpu" if on_cpu else _cuda_name())
    worker_id = args.worker_id or f"{gpu}-{port}"
    try:
        check_worker_id(worker_id)
    except ProtocolError as e:
        raise SystemExit(f"--worker-id: {e.reason}") from None
    from router.worker_auth import resolve_worker_secret

    try:
        secret, source = resolve_worker_secret(
            args.worker_secret, args.worker_secret_file, client_key if client_key is not None else args.api_key
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"--worker-secret: {e}") from None
    if source != "worker secret" and config_secret is not None:
        secret, source = config_secret, "worker secret"
    if source != "worker secret":
        print(f"launch_server: no --worker-secret; the router link is authenticated by: {source}", flush=True)
    return {
        "router_address": args.router_address,
        "worker_id": worker_id,
        "worker_gpu": gpu,
        "router_allow_remote": args.router_allow_remote,
        "worker_tier_ms": args.worker_tier_ms,
        "advertise_host": args.advertise_host,
        "router_curve_public_key": args.router_curve_public_key,
        "worker_curve_secret_key": args.worker_curve_secret_key,
        "worker_secret": secret,
    }


def _speculation_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """Checks the SLO speculation flags and sizes SGLang's speculation to the longest candidate
    (its buffers are allocated once; shorter lengths reuse them)."""
    if not args.slo_speculation:
        if args.slo_spec_steps != DEFAULT_SPEC_STEPS:
            raise SystemExit("--slo-spec-steps: only with --slo-speculation")
        if args.slo_spec_margin != 0.05:
            raise SystemExit("--slo-spec-margin: only with --slo-speculation")
        return None
    algorithm = (args.speculative_algorithm or "").upper()
    if algorithm not in SLO_SPEC_ALGORITHMS:
        raise SystemExit(
            f"--slo-speculation: needs --speculative-algorithm {'|'.join(SLO_SPEC_ALGORITHMS)} "
            f"(got {args.speculative_algorithm or 'none'}); SGLang's NGRAM worker has no per-batch length"
        )
    try:
        steps = sorted({int(x) for x in args.slo_spec_steps.split(",") if x.strip()})
    except ValueError:
        steps = []
    if not steps or steps[0] < 0 or steps[-1] < 1 or steps[-1] > 16:
        raise SystemExit(f"--slo-spec-steps: lengths in 0..16, at least one >= 1; got {args.slo_spec_steps!r}")
    if args.speculative_eagle_topk not in (None, 1):
        raise SystemExit("--speculative-eagle-topk: SLO speculation runs chains (topk 1), as SGLang's adaptive path")
    if not args.slo_spec_margin >= 0:
        raise SystemExit("--slo-spec-margin: must be >= 0")
    args.speculative_num_steps = steps[-1]
    args.speculative_eagle_topk = 1
    args.speculative_num_draft_tokens = steps[-1] + 1
    return {"candidates": steps, "margin": args.slo_spec_margin}


def _draft_ratio(args: argparse.Namespace, emulation: Any) -> float | None:
    """A draft step's cost relative to the target's, for pacing and the length choice of every
    draft-model speculation (fixed or SLO-adaptive); None: measured from the loaded weights."""
    ratio = args.slo_spec_draft_ratio
    if ratio is not None:
        if not args.speculative_algorithm:
            raise SystemExit("--slo-spec-draft-ratio: only with --speculative-algorithm")
        if not ratio >= 0:
            raise SystemExit("--slo-spec-draft-ratio: must be >= 0")
        return ratio
    if emulation is not None and (args.speculative_algorithm or "").upper() in SLO_SPEC_ALGORITHMS:
        return EMULATED_DRAFT_RATIO  # the tiny draft's weights say nothing of the emulated card's draft
    return None


def kv_host_ip(argv: list[str]) -> str | None:
    """The address a PD worker's KV transfer is announced at (SGLang reads SGLANG_HOST_IP):
    --advertise-host, else the local address of the route to a router off this machine (what the
    router sees it connect from); None: SGLang's own choice (127.0.0.1 on CPU)."""
    if _flag_value(argv, "--disaggregation-mode") not in ("prefill", "decode"):
        return None
    host = _flag_value(argv, "--advertise-host")
    if host:
        return host
    router = _flag_value(argv, "--router-address")
    from router.transport import is_loopback, local_address_towards

    if router and not is_loopback(router):
        return local_address_towards(router)
    return None


def _refuse_cpu_hook_on_gpu() -> None:
    """A CPU set-up's import hook forces SGLang's CPU engine into every interpreter of the venv."""
    from server.cpu_support.venv_hook import installed_pth

    hook = installed_pth()
    if hook is not None:
        raise SystemExit(
            f"this venv still has the CPU import hook {hook}, which forces SGLang's CPU engine: run ./slo setup "
            "on this GPU machine (it installs SGLang's GPU stack and removes the hook), or pass --device cpu"
        )


def resolve_server_args(args: argparse.Namespace, from_cli: Callable[[argparse.Namespace], Any]) -> Any:
    """SGLang's ServerArgs. A dynamic-chunking PD prefill worker runs passes at B and finishes a
    request of < 2B tokens in one pass; SGLang sizes its activation reserve (mem_fraction_static),
    prefill buffers and graphs on chunked_prefill_size while it resolves its arguments, so they are
    resolved again at 2B, B being the user's value or SGLang's default for this device."""
    server_args = from_cli(args)
    chunk = server_args.chunked_prefill_size
    if server_args.disaggregation_mode != "prefill" or args.slo_policy == "fcfs" or not (chunk and chunk > 0):
        return server_args
    from scheduler.core.dynamic_chunking import startup_chunk_size

    if getattr(server_args, "enable_dp_attention", False):
        chunk *= server_args.dp_size  # SGLang divides the declared size among attention-DP ranks
    args.chunked_prefill_size = startup_chunk_size(chunk)
    return from_cli(args)


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name().lower().replace(" ", "-")


def _emulation(argv: list[str]) -> Any:
    gpu = _flag_value(argv, "--emulate-gpu")
    if gpu is None:
        return None
    from server.emulation import DEFAULT_MODEL, resolve

    try:
        return resolve(gpu, _flag_value(argv, "--emulate-model") or DEFAULT_MODEL)
    except ValueError as e:
        raise SystemExit(f"--emulate-gpu: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(
        prog="launch_server",
        description="SGLang server with per-request SLOs (sglang-slo). All SGLang flags are accepted.",
    )
    ServerArgs.add_cli_args(parser)
    # SGLang queues without bound by default; a bound turns overload into 429s with a Retry-After
    parser.set_defaults(max_queued_requests=DEFAULT_MAX_QUEUED_REQUESTS)
    add_slo_args(parser)
    from server.worker_access import add_access_args

    add_access_args(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    wants_help = _has_flag(argv, "-h", "--help")
    on_cpu = _wants_cpu(argv)
    emulation = None if wants_help else _emulation(argv)
    if not on_cpu and not wants_help:
        _refuse_cpu_hook_on_gpu()
    if emulation is not None:
        from server.emulation import startup_flags

        # on a GPU the tiny model comes in a head size and dtype its attention backends take
        argv += startup_flags(emulation, lambda *flags: _has_flag(argv, *flags), "tiny" if on_cpu else "tiny-gpu")
    host_ip = None if wants_help else kv_host_ip(argv)
    if host_ip is not None:
        import os

        os.environ.setdefault("SGLANG_HOST_IP", host_ip)  # before the CPU PD defaults' loopback
    if on_cpu:
        activate()
        if not wants_help:
            argv = _with_cpu_defaults(argv)
    if not wants_help:
        argv = _resolve_model(argv)

    from sglang.srt.server_args import ServerArgs

    from scheduler.components.status_channel import default_address
    from scheduler.config import SloServerConfig
    from scheduler.core.policies import make_policy
    from scheduler.core.registry import ParamError
    from scheduler.core.slo import SloValidationError, parse_slo
    from server.emulation import stand_in_applies

    args = build_parser().parse_args(argv)
    from server.worker_access import access_for, guard_keys, resolve_key_flags

    resolve_key_flags(args)
    access = access_for(args)
    client_key = args.api_key
    guard_keys(args, access)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    params = {**_flag_params(args), **json_params(args.slo_policy_param, "--slo-policy-param")}
    try:
        make_policy(args.slo_policy, **params)
    except ParamError as e:
        raise SystemExit(f"--slo-policy-param: {e}") from None
    default_slo = _default_slo(args)
    if default_slo is not None:
        try:
            parse_slo(default_slo, prefix="--slo-default-")
        except SloValidationError as e:
            raise SystemExit(f"{e.field.replace('_', '-')}: {e.message}") from None
    if args.disaggregation_mode in ("prefill", "decode"):
        _check_transfer_backend(args.disaggregation_transfer_backend)
    speculation = _speculation_settings(args)
    spec_draft_ratio = _draft_ratio(args, emulation)
    if args.emulate_slowdown < 1.0:
        raise SystemExit("--emulate-slowdown: must be >= 1")
    if args.emulate_full_forward and emulation is None:
        raise SystemExit("--emulate-full-forward: only with --emulate-gpu")
    if args.slo_perf_profile:
        from scheduler.core.perf_model import load_perf_model

        try:
            load_perf_model(args.slo_perf_profile, kind="roofline")
        except Exception as e:  # noqa: BLE001 - an unreadable profile stops start-up clearly
            raise SystemExit(f"--slo-perf-profile: cannot load {args.slo_perf_profile}: {e}") from None
    for flag, value in (
        ("--slo-max-queued-tokens", args.slo_max_queued_tokens),
        ("--max-queued-requests", args.max_queued_requests),
    ):
        if value is not None and value < 1:
            raise SystemExit(f"{flag}: must be >= 1")
    if not args.slo_drain_timeout_s >= 0:
        raise SystemExit("--slo-drain-timeout-s: must be >= 0")
    if not 0 <= args.slo_tenant_fairness <= 1:
        raise SystemExit("--slo-tenant-fairness: must be in [0, 1]")
    if args.slo_program_patterns and not Path(args.slo_program_patterns).is_file():
        raise SystemExit(f"--slo-program-patterns: no such file {args.slo_program_patterns}")
    if args.slo_quantile is not None and not (0 < args.slo_quantile < 1 and args.slo_length_predictor != "none"):
        raise SystemExit("--slo-quantile must be in (0, 1) and needs a --slo-length-predictor")
    try:
        predictor_from_spec(args.slo_length_predictor)
    except ValueError as e:
        raise SystemExit(f"--slo-length-predictor {e}") from None
    except Exception as e:  # noqa: BLE001 - a bad spec or an unreadable artifact stops start-up clearly
        raise SystemExit(f"--slo-length-predictor: cannot load {args.slo_length_predictor}: {e}") from None
    if args.slo_policy != "fcfs":
        args.schedule_policy = "fcfs"  # keep the SLO policy's order: SGLang must not re-sort
        # auto: mixed where forward passes run at GPU cost (a GPU, or an emulated one)
        mixed = args.slo_batching == "mixed" or (args.slo_batching == "auto" and (not on_cpu or emulation))
        if mixed and not args.speculative_algorithm:
            args.enable_mixed_chunk = True
    if args.pp_size > 1 and args.slo_policy != "fcfs":
        raise SystemExit(
            f"--pp-size {args.pp_size}: pipeline parallelism runs with --slo-policy fcfs only (an SLO policy's "
            "plan is shared across tensor-parallel ranks, not yet across pipeline stages)"
        )
    server_args = resolve_server_args(args, ServerArgs.from_cli_args)
    stand_in = emulation is not None and stand_in_applies(
        server_args.model_path, bool(args.speculative_algorithm), args.emulate_full_forward
    )
    config = SloServerConfig(
        policy=args.slo_policy,
        policy_params=params,
        default_slo=default_slo,
        status_address=default_address(server_args.port),
        length_predictor=args.slo_length_predictor,
        predictor_quantile=args.slo_quantile,
        program_patterns=args.slo_program_patterns,
        perf_profile=args.slo_perf_profile or (str(emulation.profile) if emulation else None),
        emulate_profile=str(emulation.profile) if emulation else None,
        emulate_name=emulation.name if emulation else None,
        emulate_slowdown=args.emulate_slowdown,
        emulate_stand_in=stand_in,
        speculation=speculation,
        spec_draft_ratio=spec_draft_ratio,
        max_queued_tokens=args.slo_max_queued_tokens,
        drain_timeout_s=args.slo_drain_timeout_s,
        tenant_fairness=args.slo_tenant_fairness,
    )
    membership = _router_settings(
        args, server_args.port, emulation, on_cpu, access.table.worker_secret(), client_key or ""
    )
    base = f"http://{server_args.host}:{server_args.port}"
    print(
        f"sglang-slo: serving {server_args.model_path} with --slo-policy {args.slo_policy}.\n"
        f"  once ready, send requests to {base}/generate (native, top-level 'slo' object),\n"
        f"  {base}/v1/chat/completions (OpenAI, 'slo' object or x-slo-* headers); status: {base}/slo/status",
        flush=True,
    )
    if emulation is not None:
        print(
            f"  emulating {emulation.name} ({emulation.profile}): every forward pass paced to the profile"
            f"{f' x{args.emulate_slowdown:g} (dilated time)' if args.emulate_slowdown != 1 else ''}, "
            f"KV cache {server_args.max_total_tokens} tokens, "
            f"{'logits only (layers skipped)' if stand_in else 'the full model'} on the host",
            flush=True,
        )
    from server.process import watch_parent
    from server.sglang_http import RouterMembership, launch

    watch_parent()  # started by a launcher: never outlive it
    launch(server_args, config, RouterMembership(**membership) if membership else None, access)


if __name__ == "__main__":
    main()
