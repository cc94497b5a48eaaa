"""`python -m launch_server`: SGLang's server with per-request SLOs and SLO scheduling.

Takes every SGLang flag plus ours. With no --model-path it serves the embedded default model
(SmolLM2-135M-Instruct, no download); `--model-path tiny` serves the tiny random test model.
On a machine without CUDA it applies the CPU settings SGLang needs (each one can be overridden
by passing the flag yourself).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from launch_argv import _flag_value, _has_flag, _resolve_model, _wants_cpu, _with_cpu_defaults, kv_host_ip
from launch_checks import _refuse_cpu_hook_on_gpu, _router_settings, check_slo_args
from launch_slo_args import add_slo_args
from server.cpu_support import activate

DEFAULT_MAX_QUEUED_REQUESTS = 1024  # SGLang's --max-queued-requests through this launcher (SGLang's own: no bound)


def resolve_server_args(
    args: argparse.Namespace,
    from_cli: Callable[[argparse.Namespace], Any],
    resolved: Callable[..., tuple[Any, ...]] | None = None,
) -> Any:
    """SGLang's ServerArgs, unresolved (SGLang resolves it at launch). A dynamic-chunking PD prefill
    worker runs passes at B and finishes a request of < 2B tokens in one pass; SGLang sizes its
    activation reserve (mem_fraction_static), prefill buffers and graphs on chunked_prefill_size when
    it resolves its arguments, so the record is declared at 2B, B being the user's value or SGLang's
    default for this device. `resolved(record, *fields)`: what SGLang's resolution decides for them."""
    server_args = from_cli(args)
    if server_args.disaggregation_mode != "prefill" or args.slo_policy == "fcfs":
        return server_args
    chunk, attn_dp_size = (resolved or resolved_fields)(from_cli(args), "chunked_prefill_size", "attn_dp_size")
    if not (chunk and chunk > 0):
        return server_args
    from scheduler.core.dynamic_chunking import startup_chunk_size

    chunk *= max(1, attn_dp_size or 1)  # SGLang divides the declared size among attention-DP ranks
    args.chunked_prefill_size = startup_chunk_size(chunk)
    return from_cli(args)


def resolved_fields(record: Any, *names: str) -> tuple[Any, ...]:
    """The values SGLang's resolution gives these fields. A record holds the operator's input
    (None where SGLang picks a default) until resolved, and resolves only once: pass a spare."""
    from sglang.srt.arg_groups.overrides import resolution_result

    record.resolve_once()
    return tuple(resolution_result(record, name) for name in names)


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
    checked = check_slo_args(args, emulation, on_cpu)
    server_args = resolve_server_args(args, ServerArgs.from_cli_args)
    stand_in = emulation is not None and stand_in_applies(
        server_args.model_path,
        server_args.speculative_draft_model_path if args.speculative_algorithm else None,
        args.emulate_full_forward,
    )
    config = SloServerConfig(
        policy=args.slo_policy,
        policy_params=checked.params,
        default_slo=checked.default_slo,
        status_address=default_address(server_args.port),
        length_predictor=args.slo_length_predictor,
        predictor_quantile=args.slo_quantile,
        program_patterns=args.slo_program_patterns,
        perf_profile=args.slo_perf_profile or (str(emulation.profile) if emulation else None),
        emulate_profile=str(emulation.profile) if emulation else None,
        emulate_name=emulation.name if emulation else None,
        emulate_slowdown=args.emulate_slowdown,
        emulate_stand_in=stand_in,
        emulate_draft_acceptance=args.emulate_draft_acceptance,
        speculation=checked.speculation,
        spec_draft_ratio=checked.spec_draft_ratio,
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
    try:
        launch(server_args, config, RouterMembership(**membership) if membership else None, access)
    except Exception as e:
        _exit_failed(e)


def _exit_failed(error: Exception) -> None:
    """Stop this server's processes and exit with the error. SGLang raises when a scheduler rank
    dies during start-up but leaves its other processes (detokenizer, the surviving ranks) running,
    and the interpreter would wait on them at exit: the server would hang instead of failing."""
    import os

    from server.process import kill_tree

    logging.getLogger("sglang_slo.launch").exception("the server failed")
    kill_tree(os.getpid(), include_self=False)
    raise SystemExit(f"sglang-slo: the server failed: {error} (the failing process's own error is logged above)")


if __name__ == "__main__":
    main()
