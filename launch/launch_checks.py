"""Checks of the launcher's flags before SGLang starts: a typo or an impossible combination stops
start-up naming the flag, instead of failing later in a child process."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NamedTuple

from launch_slo_args import DEFAULT_SPEC_STEPS, EMULATED_DRAFT_RATIO, POLICY_FLAGS, SLO_SPEC_ALGORITHMS, json_params
from scheduler.core.analyzer.spec import predictor_from_spec


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


def _refuse_cpu_hook_on_gpu() -> None:
    """A CPU set-up's import hook forces SGLang's CPU engine into every interpreter of the venv."""
    from server.cpu_support.venv_hook import installed_pth

    hook = installed_pth()
    if hook is not None:
        raise SystemExit(
            f"this venv still has the CPU import hook {hook}, which forces SGLang's CPU engine: run ./slo setup "
            "on this GPU machine (it installs SGLang's GPU stack and removes the hook), or pass --device cpu"
        )


def _cuda_name() -> str:
    import torch

    return torch.cuda.get_device_name().lower().replace(" ", "-")


class CheckedSloArgs(NamedTuple):
    """What the checks derive from the flags for the scheduler's configuration."""

    params: dict[str, Any]  # the SLO policy's constructor parameters
    default_slo: dict[str, Any] | None  # the SLO of requests that carry none
    speculation: dict[str, Any] | None  # SLO-adaptive speculation settings
    spec_draft_ratio: float | None  # a draft step's cost relative to the target's (None: measured)


def check_slo_args(args: argparse.Namespace, emulation: Any, on_cpu: bool) -> CheckedSloArgs:
    """Stops start-up naming the flag on a bad value; sets the SGLang flags an SLO policy needs
    (SGLang's own ordering off, mixed chunks where passes run at GPU cost)."""
    from scheduler.core.policies import make_policy
    from scheduler.core.registry import ParamError
    from scheduler.core.slo import SloValidationError, parse_slo

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
    if not 0 <= args.emulate_draft_acceptance <= 1:
        raise SystemExit("--emulate-draft-acceptance: must be within [0, 1]")
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
        # Under speculation SGLang's own resolution turns it off again for the algorithms that
        # cannot verify beside a prefill (STANDALONE, NGRAM), with a warning; EAGLE keeps it.
        mixed = args.slo_batching == "mixed" or (args.slo_batching == "auto" and (not on_cpu or emulation))
        if mixed:
            args.enable_mixed_chunk = True
    if args.pp_size > 1 and args.slo_policy != "fcfs":
        raise SystemExit(
            f"--pp-size {args.pp_size}: pipeline parallelism runs with --slo-policy fcfs only (an SLO policy's "
            "plan is shared across tensor-parallel ranks, not yet across pipeline stages)"
        )
    return CheckedSloArgs(params, default_slo, speculation, spec_draft_ratio)
