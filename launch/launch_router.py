"""`python -m launch_router`: the SLO-aware router in front of many sglang-slo workers.

Clients talk to it exactly as to one SGLang server (HTTP, --host/--port); workers started with
`python -m launch_server --router-address tcp://127.0.0.1:<worker port>` register over ZMQ and
are routed to by --routing-policy. SIGINT/SIGTERM stop it gracefully: open streams end, workers
are told to abort them, and the sockets close.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from launch_slo_args import add_worker_secret_args, json_params
from router.dispatcher import DEFAULT_MAX_QUEUED
from router.pd import PREFILL_PLACEMENTS, SPREAD
from router.policies import ROUTING_POLICIES
from router.service import DEFAULT_LENGTH_PREDICTOR

if TYPE_CHECKING:
    from router.access import AccessTable


def _policy_params(pairs: list[str], policy: str) -> dict[str, Any]:
    """KEY=VALUE pairs (dashes in KEY read as underscores); VALUE is JSON (a bare word is taken as a
    string). Checked here against the policy's parameters, so a mistake stops start-up naming its field."""
    from scheduler.core.registry import ParamError

    params = json_params(pairs, "--routing-policy-param", lambda name: name.strip().replace("-", "_"))
    try:
        ROUTING_POLICIES.params(policy, params)
    except ParamError as e:
        raise SystemExit(f"--routing-policy-param: {e}") from None
    return params


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="launch_router", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="HTTP address for clients (default: %(default)s)")
    parser.add_argument("--port", type=int, default=30000, help="HTTP port for clients (default: %(default)s)")
    parser.add_argument("--worker-port", type=int, help="ZMQ port workers connect to on 127.0.0.1 (default: port+100)")
    parser.add_argument("--worker-bind", help="full ZMQ bind address for workers, e.g. tcp://0.0.0.0:30100")
    parser.add_argument(
        "--allow-remote-workers",
        action="store_true",
        help="allow a non-loopback --worker-bind (needs --curve-secret-key: links off the machine are encrypted)",
    )
    parser.add_argument(
        "--curve-secret-key",
        metavar="FILE",
        help="the router's CURVE key pair (a zmq.auth .key_secret file): the worker links are encrypted and "
        "workers must know its public half (launch_server --router-curve-public-key); required off loopback",
    )
    parser.add_argument("--routing-policy", choices=sorted(ROUTING_POLICIES), default="goodserve")
    parser.add_argument(
        "--routing-policy-param",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="policy constructor parameter, VALUE in JSON (repeatable), e.g. tau=20 or tiers_ms=[50,100]",
    )
    parser.add_argument(
        "--api-key",
        help="a client key: clients send 'Authorization: Bearer KEY' (generation, model and server info). "
        "Visible in the process list: prefer --api-key-file or $SGLANG_SLO_API_KEY",
    )
    parser.add_argument("--api-key-file", metavar="PATH", help="read the client key from this file")
    parser.add_argument(
        "--admin-api-key",
        help="the operator's key (/slo/status, /slo/migrate, /flush_cache, /metrics and every client route; at "
        "least 16 bytes); a client key never reaches those. Prefer --admin-api-key-file or "
        "$SGLANG_SLO_ADMIN_API_KEY",
    )
    parser.add_argument("--admin-api-key-file", metavar="PATH", help="read the admin key from this file")
    parser.add_argument(
        "--auth-config",
        metavar="FILE",
        help="keys with roles (client, admin, metrics, worker), per-key SLO limits and shares, in one YAML "
        "file (router/access.py); its worker key is the worker secret",
    )
    add_worker_secret_args(
        parser,
        "the workers' credential, separate from every HTTP key (at least 16 bytes; prefer "
        "--worker-secret-file, $SGLANG_SLO_WORKER_SECRET or a worker key in --auth-config): workers prove it "
        "in a nonce handshake and every message to them is authenticated with it. Required with "
        "--allow-remote-workers; on loopback, without it, --api-key stands in (then anyone holding the "
        "client key can join as a worker)",
    )
    parser.add_argument(
        "--max-queued-requests",
        type=int,
        metavar="N",
        default=DEFAULT_MAX_QUEUED,
        help="at most N requests waiting for their first token; beyond, a new request is answered at once with "
        "HTTP 429 queue_full and a Retry-After from the workers' predicted queue drain (default %(default)s)",
    )
    parser.add_argument(
        "--request-timeout-s",
        type=float,
        default=600.0,
        metavar="S",
        help="a request that makes no progress for S seconds in total, over every worker it is moved to, is "
        "answered 504; a worker silent for a share of S loses it to another first (default %(default)s; 0 disables)",
    )
    parser.add_argument(
        "--stall-after-s",
        type=float,
        default=30.0,
        metavar="S",
        help="a worker with work whose engine has not stepped for S seconds is unhealthy and its requests move "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--forget-after-s",
        type=float,
        default=600.0,
        metavar="S",
        help="dead workers are forgotten (status, metrics, policy state) S seconds after they died "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--tokenizer-path",
        help="a local folder with the model's tokenizer files (default: the first registered worker's model "
        "path, which must then exist on the router's machine too)",
    )
    parser.add_argument("--dead-after-s", type=float, default=2.0, help="a silent worker is dead after this long")
    parser.add_argument(
        "--pd-prefill-placement",
        choices=PREFILL_PLACEMENTS,
        default=SPREAD,
        help="with prefill and decode workers: 'spread' sends each prompt to the prefill worker that finishes it "
        "soonest (the most TTFTs met on a fixed pool); 'pack' to the busiest one that still meets its TTFT "
        "(PolyServe's load gradient, which leaves the others idle for a pool that scales down) (default %(default)s)",
    )
    parser.add_argument(
        "--migrate-interval-s",
        type=float,
        default=0.1,
        help="how often the policy is asked for migrations; 0 disables them (default: %(default)s)",
    )
    parser.add_argument(
        "--admission-timeout-s", type=float, default=2.0, help="how long a request waits for a first worker (then 503)"
    )
    parser.add_argument(
        "--length-predictor",
        default=DEFAULT_LENGTH_PREDICTOR,
        metavar="PATH|trained[:Q]|history[:Q]|history-len[:Q]|none",
        help="output-length predictor the SLO-aware policies plan with: 'trained:Q' (default trained:0.9: the "
        "Q-quantile of the answer's length given the prompt's, from a table trained on a public chat trace, until "
        "recent answers bound better), 'history:Q' (the Q-quantile of recent answers' lengths alone, learned "
        "online), 'history' (their mean), 'history-len[:Q]' (the same among answers to prompts of about its length "
        "first), 'none' (the client's max_new_tokens), a table (.json, benchmarks/predictor/train_length.py) or a "
        "saved analyzer artifact (scheduler.core.analyzer.train_cli --out: MoE, QRF)",
    )
    parser.add_argument(
        "--incremental-streaming-output",
        action="store_true",
        help="native /generate streams send deltas instead of cumulative text/output_ids (as SGLang's flag)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def config_from_args(args: argparse.Namespace) -> Any:
    """Validated RouterConfig; every mistake is a SystemExit naming its flag."""
    from router.service import RouterConfig
    from router.transport import CurveKeys, check_loopback, is_loopback

    for name in ("dead_after_s", "admission_timeout_s", "stall_after_s", "forget_after_s"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')}: must be positive")
    if args.request_timeout_s < 0:
        raise SystemExit("--request-timeout-s: must be >= 0 (0 disables it)")
    if args.max_queued_requests is not None and args.max_queued_requests < 1:
        raise SystemExit("--max-queued-requests: must be >= 1")
    if args.migrate_interval_s < 0:
        raise SystemExit("--migrate-interval-s: must be >= 0 (0 disables migrations)")
    if args.worker_bind and args.worker_port is not None:
        raise SystemExit("--worker-bind and --worker-port: give one of them")
    worker_port = args.port + 100 if args.worker_port is None else args.worker_port
    bind = args.worker_bind or f"tcp://127.0.0.1:{worker_port}"
    try:
        check_loopback(bind, args.allow_remote_workers)
    except ValueError as e:
        raise SystemExit(f"--worker-bind: {e}") from None
    if args.curve_secret_key:
        try:
            CurveKeys.for_router(args.curve_secret_key)
        except ValueError as e:
            raise SystemExit(f"--curve-secret-key: {e}") from None
    elif not is_loopback(bind):
        raise SystemExit(
            f"--worker-bind {bind}: links that leave the machine are encrypted: give --curve-secret-key "
            "(make keys with: python -c \"import zmq.auth; zmq.auth.create_certificates('keys', 'router')\")"
        )
    api_key, access = access_from_args(args)
    secret = worker_secret_from_args(args, api_key, access, remote=args.allow_remote_workers or not is_loopback(bind))
    if args.tokenizer_path and not Path(args.tokenizer_path).exists():
        raise SystemExit(f"--tokenizer-path: no such file or folder {args.tokenizer_path}")
    return RouterConfig(
        worker_bind=bind,
        allow_remote_workers=args.allow_remote_workers,
        curve_secret_key=args.curve_secret_key,
        routing_policy=args.routing_policy,
        policy_params=_policy_params(args.routing_policy_param, args.routing_policy),
        api_key=api_key,
        access=access,
        tokenizer_path=args.tokenizer_path,
        dead_after_s=args.dead_after_s,
        migrate_interval_s=args.migrate_interval_s or None,
        admission_timeout_s=args.admission_timeout_s,
        length_predictor=args.length_predictor,
        incremental_streaming_output=args.incremental_streaming_output,
        worker_secret=secret,
        max_queued_requests=args.max_queued_requests,
        request_timeout_s=args.request_timeout_s or None,
        stall_after_s=args.stall_after_s,
        forget_after_s=args.forget_after_s,
        prefill_placement=args.pd_prefill_placement,
    )


def access_from_args(args: argparse.Namespace) -> tuple[str | None, AccessTable]:
    """(the client key of --api-key, the AccessTable of every HTTP key); a mistake is a SystemExit
    naming its flag or the file's field."""
    from router.access import (
        ADMIN_API_KEY_ENV,
        API_KEY_ENV,
        MIN_KEY_BYTES,
        AccessConfigError,
        AccessTable,
        read_key,
    )

    try:
        api_key = read_key(args.api_key, args.api_key_file, API_KEY_ENV, "--api-key")
        admin_key = read_key(args.admin_api_key, args.admin_api_key_file, ADMIN_API_KEY_ENV, "--admin-api-key")
    except AccessConfigError as e:
        raise SystemExit(str(e)) from None
    if admin_key is not None and len(admin_key.encode()) < MIN_KEY_BYTES:
        raise SystemExit(f"--admin-api-key: must be at least {MIN_KEY_BYTES} bytes")
    try:
        return api_key, AccessTable.build(api_key=api_key, admin_api_key=admin_key, config_path=args.auth_config)
    except AccessConfigError as e:
        where = f"--auth-config {args.auth_config}" if args.auth_config else "--admin-api-key"
        raise SystemExit(f"{where}: {e}") from None


def worker_secret_from_args(
    args: argparse.Namespace, api_key: str | None, access: AccessTable, remote: bool
) -> bytes | None:
    """The workers' credential. Off loopback it must be a secret of its own: a key any client
    holds (the legacy stand-in) would let that client register as a worker and read others' prompts."""
    from router.worker_auth import SECRET_ENV, resolve_worker_secret

    if args.worker_secret is not None:
        logging.getLogger("launch_router").warning(
            "--worker-secret on the command line is visible in the process list: prefer --worker-secret-file or $%s",
            SECRET_ENV,
        )
    try:
        secret, source = resolve_worker_secret(
            args.worker_secret, args.worker_secret_file, api_key, access.worker_secret()
        )
    except (OSError, ValueError) as e:
        raise SystemExit(f"--worker-secret: {e}") from None
    if source == "worker secret":
        assert secret is not None
        if not access.is_open and access.authenticate(b"Bearer " + secret) is not None:
            raise SystemExit(
                "--worker-secret: must differ from every HTTP key (--api-key, --admin-api-key, --auth-config)"
            )
        return secret
    if remote:
        raise SystemExit(
            "--worker-secret: remote workers (--allow-remote-workers) need a worker secret of their own "
            "(--worker-secret-file, $SGLANG_SLO_WORKER_SECRET or a worker key in --auth-config); "
            "a client key does not stand in off this machine"
        )
    logging.getLogger("launch_router").warning(
        "no --worker-secret: workers are authenticated by %s%s",
        source,
        " (anyone holding the client API key can join as a worker)" if source.startswith("api key") else "",
    )
    return secret


def build_service(config: Any) -> Any:
    """RouterService, with a bad policy parameter or predictor turned into a SystemExit."""
    from router.service import RouterService

    try:
        return RouterService(config)
    except ValueError as e:
        text = str(e)
        raise SystemExit(text if text.startswith("--") else f"--routing-policy-param: {text}") from None
    except Exception as e:  # noqa: BLE001 - an unreadable predictor artifact stops start-up clearly
        if config.length_predictor:
            raise SystemExit(f"--length-predictor: cannot load {config.length_predictor}: {e}") from None
        raise


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="[%(asctime)s] %(name)s %(levelname)s %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    config = config_from_args(args)
    service = build_service(config)
    from server.process import watch_parent

    watch_parent()  # started by a launcher: never outlive it

    import uvicorn

    from router.http_api import create_app

    def announce(svc: Any) -> None:
        base = f"http://{args.host}:{args.port}"
        print(
            f"launch_router: {config.routing_policy} router; clients: {base} (/generate, /v1/chat/completions, "
            f"/slo/status); workers: launch_server --router-address {svc.worker_address}",
            flush=True,
        )

    app = create_app(service, on_started=announce)
    import asyncio

    import zmq.asyncio

    from router.graceful import GracefulServer
    from router.transport import CLOSE_LINGER_MS

    async def end_streams() -> None:
        await service.stop()  # open streams get the 503 event, their workers an Abort
        # uvicorn re-raises the signal once it is done, which ends the process at once: the
        # Aborts must have left by then (destroy waits for them, at most the linger)
        await asyncio.to_thread(zmq.asyncio.Context.instance().destroy, CLOSE_LINGER_MS)

    server = GracefulServer(
        uvicorn.Config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            lifespan="on",
            timeout_graceful_shutdown=5,
            access_log=args.log_level == "debug",
        ),
        before_drain=end_streams,
    )
    server.run()  # SIGINT/SIGTERM: the streams end, uvicorn drains, the lifespan stops the rest
    if not server.started:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
