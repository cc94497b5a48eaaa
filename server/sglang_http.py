"""The HTTP-process adapter (the only server-side module that touches SGLang internals).

It launches SGLang's own HTTP server with three swaps through SGLang's fork hooks: our
TokenizerManager subclass (SLO reports, shed answers, delta streams for the router's agent),
our scheduler process (the policy core), and our ASGI middleware on SGLang's app (SLO parsing,
status, metrics, draining). Every SGLang route keeps working.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, fields
from typing import Any

import fastapi
from sglang.srt.entrypoints import http_server
from sglang.srt.entrypoints.api_contract import generate_contract_error
from sglang.srt.entrypoints.engine import init_tokenizer_manager
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.tokenizer_manager import TokenizerManager

from scheduler.components.status_channel import ReplicaStatus, remove_ipc_file
from scheduler.config import SloServerConfig
from scheduler.core.field_error import FieldError
from scheduler.core.sampling_guard import check_sampling_params
from scheduler.core.shed_wire import shed_from
from scheduler.core.slo import SloSpec
from scheduler.core.slo_wire import read_injected
from scheduler.reporting.metrics import SloMetrics
from scheduler.reporting.reports import SloReportBook
from server import request_context
from server.delta_stream import DeltaStream
from server.draining import Drain, install_drain_handler
from server.generate_checks import check_per_prompt_fields, check_rid, check_token_ids
from server.process import kill_tree
from server.scheduler_process import run_slo_scheduler_process
from server.slo_middleware import SloMiddleware
from server.worker_access import WorkerAccess

_BOOK = SloReportBook(SloMetrics())
_MANAGERS: list[TokenizerManager] = []  # the process's tokenizer manager, once SGLang built it
_DRAIN_ON_TERM: list[Callable[[], None]] = []  # installs the drain handler on the running loop


def _first_custom_params(obj: Any) -> dict[str, Any] | None:
    params = getattr(obj, "sampling_params", None)
    for p in params if isinstance(params, list) else [params]:
        if isinstance(p, dict) and isinstance(p.get("custom_params"), dict):
            return p["custom_params"]
    return None


def request_slo(ctx: request_context.RequestContext | None, obj: Any) -> tuple[SloSpec, float] | None:
    """The SLO and arrival of a request: the middleware's parsed object when it handled the
    request (its route generates), else what the request's custom_params carry, validated
    here: the scheduler decodes what reaches it without checking it again."""
    if ctx is not None and ctx.slo is not None and ctx.arrival is not None:
        return ctx.slo, ctx.arrival
    return read_injected(_first_custom_params(obj))


def _rids(obj: Any) -> list[str]:
    rid = getattr(obj, "rid", None)
    if isinstance(rid, str):
        return [rid]
    return [r for r in rid or [] if isinstance(r, str)]


class SloTokenizerManager(TokenizerManager):
    """Scores every finished request against its SLO and puts the report in meta_info; notes a
    shed for the HTTP edge's answer; streams the router's agent deltas, not cumulative output."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _MANAGERS.append(self)

    def auto_create_handle_loop(self) -> None:
        """Change: SGLang registers its own SIGTERM handler on the event loop when the loop is
        first needed, often by the warm-up request after start-up; the drain handler, installed
        at start-up, must win (else SIGTERM waits for requests without ever saying draining)."""
        fresh = self.event_loop is None
        super().auto_create_handle_loop()
        if fresh and threading.current_thread() is threading.main_thread():
            for install in _DRAIN_ON_TERM:
                install()

    async def _handle_abort_finish_reason(self, out: dict, state: Any, is_stream: bool) -> Any:
        """Changes: a request the scheduler shed is noted for the HTTP edge, which answers it with
        the shed's status, Retry-After and reason; SGLang raises only for 503s, so a 429 (a full
        queue) is raised here for non-streaming requests."""
        shed = shed_from(out.get("meta_info", {}).get("finish_reason"))
        ctx = request_context.current()
        if shed is not None and ctx is not None:
            ctx.shed = shed
        handled = await super()._handle_abort_finish_reason(out, state, is_stream)
        if shed is not None and not is_stream:
            raise fastapi.HTTPException(status_code=shed.status, detail=shed.message, headers=shed.headers())
        return handled

    async def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[Any]:
        check_token_ids(getattr(obj, "input_ids", None), self.model_config.vocab_size)
        check_rid(obj)
        if isinstance(obj, GenerateReqInput):  # every route's params (OpenAI's translated), ids in the vocabulary
            check_sampling_params(obj.sampling_params, vocab_size=self.model_config.vocab_size)
        ctx = request_context.current()
        injected = request_slo(ctx, obj)
        started: set[str] = set()
        # The router's agent reads each chunk's new tokens only: SGLang's default stream repeats
        # every token so far in every chunk, O(N^2) bytes over a long answer.
        agent_stream = ctx is not None and ctx.from_agent and bool(getattr(obj, "stream", False))
        delta = DeltaStream() if agent_stream and not self.incremental_streaming_output else None

        def track(rid: str) -> None:
            if injected is not None and rid not in started:
                started.add(rid)
                _BOOK.start(rid, *injected, clamped=ctx.slo_clamped if ctx is not None else None)

        try:
            async for out in super().generate_request(obj, request):
                for item in out if isinstance(out, list) else [out]:
                    meta = item.get("meta_info") if isinstance(item, dict) else None
                    if meta is not None and meta.get("id") is not None:
                        track(meta["id"])
                        _BOOK.on_output(meta)
                yield out if delta is None or not isinstance(out, dict) else delta.next(out)
        except BaseException:
            for rid in _rids(obj):
                track(rid)
                _BOOK.on_abort(rid)
            raise

    def _init_req_state(self, obj: Any, request: Any = None) -> Any:
        """Changes SGLang's split of a normalised request: a per-prompt field of the wrong shape
        (a list for one prompt, a list shorter than the batch) is a 400 here, before SGLang
        indexes past its end (a 500) or its scheduler ends on it."""
        check_per_prompt_fields(obj)
        return super()._init_req_state(obj, request)

    def _validate_one_request(self, obj: Any, input_ids: Any) -> None:
        """Changes SGLang's per-request check: a prompt of no tokens (`text: ""` on a tokenizer
        without BOS, `input_ids: []`) reached the model, whose forward then took the scheduler
        down; SGLang offers no validation hook, so this override refuses it as a 400."""
        super()._validate_one_request(obj, input_ids)
        if input_ids is not None and len(input_ids) == 0 and getattr(obj, "input_embeds", None) is None:
            field = "input_ids" if getattr(obj, "text", None) is None else "text"
            raise ValueError(f"{field}: the prompt is empty (no tokens); send at least one token")


def generate_contract_refusal(body: dict[str, Any]) -> FieldError | None:
    """SGLang's /generate route checks a body against SGLang's API contract before anything else
    and answers a violation as a bare-string error naming no field. The same check, run at our
    edge first: each top-level field is decoded alone to find the refused one, so the 400 names it."""
    message = generate_contract_error(body)
    if message is None:
        return None
    field = next((name for name, value in body.items() if generate_contract_error({name: value})), "body")
    return FieldError(field, message)


def init_slo_tokenizer_manager(server_args: Any, port_args: Any, *args: Any, **kwargs: Any) -> Any:
    return init_tokenizer_manager(server_args, port_args, SloTokenizerManager)


@dataclass(frozen=True)
class RouterMembership:
    """This worker's place in a router's pool (checked by the launcher)."""

    router_address: str  # the router's ZMQ address
    worker_id: str  # the name the router knows this worker by
    worker_gpu: str  # the GPU kind it reports (heterogeneity-aware routing)
    router_allow_remote: bool = False  # connect to a router off this machine
    worker_tier_ms: float | None = None  # the TPOT tier it asks to start in (PolyServe pools)
    advertise_host: str | None = None  # where the router reaches it (None: where it connects from)
    router_curve_public_key: str | None = None  # the router's CURVE public key file: an encrypted link
    worker_curve_secret_key: str | None = None  # its own CURVE key pair file (None: ephemeral)
    worker_secret: bytes | None = None  # the router's worker credential (router/worker_auth.py)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _join_router(
    server_args: Any,
    config: SloServerConfig,
    membership: RouterMembership,
    agent_token: str | None,
    engine: Callable[[], dict[str, Any]],
    drain: Drain,
    pre_exit: list[Callable[[], None]],
) -> None:
    """Start the agent that links this server to its router (it waits until the server is up)."""
    from router.transport import CurveKeys
    from server.worker_agent import AgentConfig, start_agent_thread

    wildcard = server_args.host in ("0.0.0.0", "::", "")
    local = "127.0.0.1" if wildcard else server_args.host  # the agent's own calls stay on this machine
    # a wildcard tells the router to reach the worker where its connection comes from
    advertised = membership.advertise_host or ("0.0.0.0" if wildcard else server_args.host)
    curve = None
    if membership.router_curve_public_key:
        curve = CurveKeys.for_worker(membership.router_curve_public_key, membership.worker_curve_secret_key)
    mode = server_args.disaggregation_mode  # "null" when co-located
    agent = AgentConfig(
        router_address=membership.router_address,
        worker_id=membership.worker_id,
        gpu=membership.worker_gpu,
        model=str(server_args.model_path),
        http_url=_url(local, server_args.port),
        advertised_url=_url(advertised, server_args.port),
        curve=curve,
        api_key=server_args.api_key,
        agent_token=agent_token,
        allow_remote=membership.router_allow_remote,
        role=mode if mode in ("prefill", "decode") else "mixed",
        bootstrap_port=server_args.disaggregation_bootstrap_port if mode == "prefill" else None,
        tier_ms=membership.worker_tier_ms,
        time_scale=config.emulate_slowdown if config.emulate_profile else 1.0,
        worker_secret=membership.worker_secret,
    )
    handle = start_agent_thread(agent, engine, drain)
    pre_exit.append(handle.hand_back)


def _outermost(app: fastapi.FastAPI, middleware: type) -> None:
    """Starlette nests middleware in reverse order of adding, and SGLang adds its own (its key
    check, metrics) inside launch_server, after ours: the stack is built with ours outside them,
    so every request meets the worker's key check before anything of SGLang's."""
    build = app.build_middleware_stack

    def build_ours_first() -> Any:
        app.user_middleware.sort(key=lambda m: m.cls is not middleware)  # stable: the rest keep their order
        return build()

    app.build_middleware_stack = build_ours_first  # type: ignore[method-assign]


def status_replicas(server_args: Any) -> int:
    """How many schedulers publish their status: one per data-parallel replica, or one per
    attention-DP rank (SGLang 0.5.23 spells that --attn-dp-size; the deprecated --dp-size N
    --enable-dp-attention reaches the launcher as dp_size N and resolves to it)."""
    widths = (getattr(server_args, "dp_size", 1), getattr(server_args, "attn_dp_size", 1))
    return max(int(width or 1) for width in widths)


def launch(
    server_args: Any,
    config: SloServerConfig,
    membership: RouterMembership | None = None,
    access: WorkerAccess | None = None,
) -> None:
    """Start SGLang's HTTP server with the SLO adapter; blocks until shutdown. `access`: the
    worker's keys and roles (None: SGLang's own key check, as configured in server_args); with
    keys, server_args carries the internal key as both of SGLang's (worker_access.guard_keys),
    so SGLang's warm-up and this worker's agent call with it."""
    from sglang.srt.environ import envs

    config.to_env()  # inherited by the spawned scheduler process
    subscriber = ReplicaStatus(config.status_address, status_replicas(server_args))
    for address in subscriber.addresses:
        atexit.register(remove_ipc_file, address)
    started = time.time()

    def status() -> dict[str, Any]:
        engine = dict(subscriber.latest)
        return {
            "policy": config.policy,
            "policy_params": config.policy_params,
            "default_slo": config.default_slo,
            "uptime_s": round(time.time() - started, 3),
            "engine": engine,
            "queue": {"waiting": engine.get("waiting"), "running": engine.get("running")},
            "attainment": _BOOK.metrics.attainment(),
            "tiers": _BOOK.metrics.tiers(),
            "draining": drain.active,
        }

    agent_token = secrets.token_hex(16) if membership is not None else None
    drain = Drain()
    pre_exit: list[Callable[[], None]] = []

    def in_flight() -> int:
        return sum(len(tm.rid_to_state) for tm in _MANAGERS)

    def exit_now() -> None:
        for hook in pre_exit:  # the agent hands what is left back to the router
            hook()
        kill_tree(os.getpid(), include_self=False)  # SGLang's scheduler and detokenizer
        os._exit(0)

    def on_started() -> None:  # after uvicorn installed its own handlers: ours must win
        loop = asyncio.get_running_loop()
        _DRAIN_ON_TERM[:] = [lambda: install_drain_handler(drain, in_flight, config.drain_timeout_s, exit_now, loop)]
        _DRAIN_ON_TERM[0]()

    http_server.app.add_middleware(
        SloMiddleware,
        book=_BOOK,
        default_slo=config.default_spec(),
        status=status,
        agent_token=agent_token,
        drain=drain,
        on_started=on_started,
        vertex_fields=frozenset(f.name for f in fields(GenerateReqInput)),
        access=access,
        decompression=bool(envs.SGLANG_ENABLE_REQUEST_DECOMPRESSION.get()),
        contract=generate_contract_refusal,
    )
    _outermost(http_server.app, SloMiddleware)
    if membership is not None:
        _join_router(server_args, config, membership, agent_token, lambda: dict(subscriber.latest), drain, pre_exit)
    http_server.launch_server(
        server_args,
        init_tokenizer_manager_func=init_slo_tokenizer_manager,
        run_scheduler_process_func=run_slo_scheduler_process,
    )
