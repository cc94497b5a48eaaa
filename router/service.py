"""The router process minus HTTP: worker endpoint, registry, policy, dispatcher, tokenizer,
reports, the live PD sizing (router/pool_sizing.py) and the calls on workers' own HTTP servers
(router/worker_proxy.py).

Built in two steps so bad configuration fails before anything binds: the constructor validates
and builds the policy (a SystemExit-worthy ValueError for a bad parameter), `start()` binds the
worker socket and starts the dispatcher on the running event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq.asyncio

from router.access import AccessTable
from router.dispatcher import DEFAULT_MAX_QUEUED, DEFAULT_REQUEST_TIMEOUT_S, Dispatcher
from router.flight import RequestStream
from router.membership import WorkerRegistry
from router.monitoring import RouterCollector, RouterReports
from router.pd import PREFILL, SPREAD
from router.pd_sizing import MixTracker, tpot_tier
from router.policies import RoutingContext, make_routing_policy
from router.pool_sizing import PoolSizer
from router.prefix import DEFAULT_BLOCK_TOKENS, prefix_hashes
from router.protocol import Submit
from router.routing_views import RouteRequest, WorkerView
from router.tokenizer import RouterTokenizer, TokenizerUnavailable
from router.transport import CurveKeys, RouterEndpoint
from router.worker_auth import RouterAuth
from router.worker_proxy import WorkerProxy
from scheduler.core.analyzer.spec import DEFAULT_LENGTH_PREDICTOR, predictor_from_spec
from scheduler.core.slo import SloSpec

logger = logging.getLogger(__name__)

DEFAULT_WORKER_BIND = "tcp://127.0.0.1:30100"


@dataclass
class RouterConfig:
    """Everything launch_router's flags set; the defaults are the flags' defaults."""

    worker_bind: str = DEFAULT_WORKER_BIND
    allow_remote_workers: bool = False
    curve_secret_key: str | None = None  # the router's CURVE key pair file: workers' links encrypted
    routing_policy: str = "goodserve"
    policy_params: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None  # a client key; used only when `access` is None
    access: AccessTable | None = None  # every HTTP key with its role (router/access.py); None: from api_key
    tokenizer_path: str | None = None  # None: the model path of the first registered worker
    dead_after_s: float = 2.0
    migrate_interval_s: float | None = 0.1  # None: never ask the policy for migrations
    admission_timeout_s: float = 2.0
    reap_interval_s: float = 0.25
    length_predictor: str | None = DEFAULT_LENGTH_PREDICTOR  # see make_length_predictor
    default_slo: SloSpec | None = None  # for requests that carry none (None: best effort)
    incremental_streaming_output: bool = False  # SGLang's flag: native streams send deltas
    proxy_timeout_s: float = 30.0
    worker_secret: bytes | None = None  # the workers' credential (router/worker_auth.py)
    max_queued_requests: int | None = DEFAULT_MAX_QUEUED  # requests without a first token; beyond: 429
    request_timeout_s: float | None = DEFAULT_REQUEST_TIMEOUT_S  # no progress this long, over all its workers: 504
    stall_after_s: float = 30.0  # a busy worker whose engine does not step this long is unhealthy
    forget_after_s: float = 600.0  # dead workers are forgotten this long after they died
    prefill_placement: str = SPREAD  # PD: where prompts go on the prefill pool (router/pd.py)


def make_length_predictor(spec: str | None) -> Any:
    """The router's predictor for `spec` (scheduler.core.analyzer.spec: trained[:Q], history[:Q],
    none, or an artifact); the default's histories learn online from completions (`observe_output`). On the
    routing benchmark the mean sent long answers to slow cards: GoodServe attained 42 % with it
    and 75 % with the history:0.9 bound."""
    try:
        return predictor_from_spec(spec)
    except ValueError as e:
        raise ValueError(f"--length-predictor {e}") from None


@dataclass(frozen=True)
class GenerateCall:
    """One parsed client request, whatever route it came from."""

    rid: str
    input_ids: list[int]
    sampling_params: dict[str, Any]
    slo: SloSpec
    stream: bool
    arrival_unix: float  # wall clock at router arrival (SLO reports, the workers' arrival)
    arrival_s: float  # router clock (time.monotonic) at arrival (policies)
    prompt_text: str | None = None  # when the client sent text (the length predictor reads it)
    prompt_field: str = "text"  # the body field the prompt came from (errors name it)
    # What the caller's key limits changed in its SLO (slo_limits.apply_limits): the report says so
    slo_clamped: dict[str, Any] | None = None

    @property
    def max_new_tokens(self) -> int | None:
        value = self.sampling_params.get("max_new_tokens")
        return value if isinstance(value, int) and not isinstance(value, bool) else None


class PromptTooLong(ValueError):
    """No worker's model takes a prompt this long; the HTTP layer answers 400 naming the field."""


class RouterService:
    """Owns the router's parts; `start()`/`stop()` run on the serving event loop."""

    def __init__(
        self,
        config: RouterConfig,
        *,
        ctx: zmq.asyncio.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        tokenizer: RouterTokenizer | None = None,
        predictor: Any = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.registry = WorkerRegistry(
            dead_after_s=config.dead_after_s, stall_after_s=config.stall_after_s, forget_after_s=config.forget_after_s
        )
        self.auth = RouterAuth(config.worker_secret)
        context = RoutingContext(running_on=lambda wid: self.dispatcher.running_on(wid), clock=clock)
        self.policy = make_routing_policy(config.routing_policy, context, **config.policy_params)
        self.block_tokens = int(getattr(self.policy, "block_tokens", DEFAULT_BLOCK_TOKENS))
        self.tokenizer = tokenizer if tokenizer is not None else RouterTokenizer(config.tokenizer_path)
        self.predictor = predictor if predictor is not None else make_length_predictor(config.length_predictor)
        self.reports = RouterReports()
        policy_status = getattr(self.policy, "status", None)
        self.mix = MixTracker(start=clock())  # the live mix, for the PD sizing signals
        self.sizer = PoolSizer(self.mix)
        # the workers' own HTTP servers, over the worker link (the dispatcher exists once started)
        self.proxy = WorkerProxy(lambda *call: self.dispatcher.fetch(*call), self.healthy, config.proxy_timeout_s)
        self.reports.metrics.registry.register(
            RouterCollector(
                self._dispatcher_status,
                self.views,
                policy_status if callable(policy_status) else None,
                self.pd_sizing,
            )
        )
        self._ctx = ctx
        self._endpoint: RouterEndpoint | None = None
        self._dispatcher: Dispatcher | None = None
        self._preload: asyncio.Task[None] | None = None
        self.started_unix: float | None = None

    # --- lifecycle ---

    async def start(self) -> None:
        cfg = self.config
        curve = CurveKeys.for_router(cfg.curve_secret_key) if cfg.curve_secret_key else None
        self._endpoint = RouterEndpoint(
            cfg.worker_bind, allow_remote=cfg.allow_remote_workers, ctx=self._ctx, curve=curve
        )
        self._dispatcher = Dispatcher(
            self._endpoint,
            self.policy,
            self.registry,
            clock=self.clock,
            reap_interval_s=cfg.reap_interval_s,
            migrate_interval_s=cfg.migrate_interval_s,
            admission_timeout_s=cfg.admission_timeout_s,
            request_timeout_s=cfg.request_timeout_s,
            max_queued=cfg.max_queued_requests,
            auth=self.auth,
            decode=lambda ids: self.tokenizer.decode(ids, skip_special_tokens=False),  # as SGLang matches stops
            prefill_placement=cfg.prefill_placement,
        )
        try:
            await self._dispatcher.start()
        except BaseException:
            self._endpoint.close()
            raise
        self._preload = asyncio.create_task(self._preload_tokenizer(), name="router-tokenizer-preload")
        self.started_unix = time.time()

    async def stop(self) -> None:
        """End open streams (503), stop the loops, close the socket; idempotent."""
        if self._preload is not None:
            self._preload.cancel()
            with contextlib.suppress(BaseException):
                await self._preload
            self._preload = None
        if self._dispatcher is not None:
            await self._dispatcher.stop()
        if self._endpoint is not None:
            self._endpoint.close()

    @property
    def dispatcher(self) -> Dispatcher:
        if self._dispatcher is None:
            raise RuntimeError("router service not started")
        return self._dispatcher

    @property
    def worker_address(self) -> str:
        """Where workers connect (the bound address: the real port when the config said 0)."""
        if self._endpoint is None:
            raise RuntimeError("router service not started")
        return self._endpoint.address

    # --- workers ---

    def views(self) -> list[WorkerView]:
        return self.registry.views(self.clock())

    def healthy(self) -> list[WorkerView]:
        return [v for v in self.views() if v.healthy]

    def _dispatcher_status(self) -> dict[str, Any]:
        return self._dispatcher.status() if self._dispatcher is not None else {}

    def model_path_hint(self) -> str | None:
        """The first registered worker's model path: the tokenizer to use when none was given."""
        for worker_id in self.registry.worker_ids():
            reg = self.registry.registration(worker_id)
            if reg is not None:
                return reg.model
        return None

    async def _preload_tokenizer(self) -> None:
        """Load the tokenizer as soon as its path is known, so the first request does not wait."""
        while not self.tokenizer.loaded:
            path = self.config.tokenizer_path or self.model_path_hint()
            if path:
                try:
                    await self.tokenizer.ensure(path)
                except TokenizerUnavailable as exc:
                    logger.error("%s", exc)
                return
            await asyncio.sleep(0.1)

    async def ready_tokenizer(self) -> RouterTokenizer:
        """The loaded tokenizer; waits up to the admission timeout for a worker to name its path."""
        if self.tokenizer.loaded:
            return self.tokenizer
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.admission_timeout_s
        path = self.config.tokenizer_path or self.model_path_hint()
        while path is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
            path = self.model_path_hint()
        await self.tokenizer.ensure(path)
        return self.tokenizer

    # --- requests ---

    def route_request(self, call: GenerateCall) -> RouteRequest:
        return RouteRequest(
            rid=call.rid,
            prompt_tokens=len(call.input_ids),
            slo=call.slo,
            arrival_s=call.arrival_s,
            prefix_hashes=prefix_hashes(call.input_ids, self.block_tokens),
            predicted_output_tokens=self.predict_output(call),
            max_new_tokens=call.max_new_tokens,
        )

    def tier_of(self, slo: SloSpec) -> float | None:
        """The request's TPOT tier as the policy bins it (PolyServe's configured tiers), else its
        TPOT on a fixed grid (pd_sizing.tpot_tier): tiers key the mix tracker and metric labels."""
        tier_of = getattr(self.policy, "tier_of", None)
        tier = slo.tpot_ms
        if tier_of is not None:
            tier = tier_of(RouteRequest(rid="-", prompt_tokens=0, slo=slo, arrival_s=0.0))
        return tier if tier is None or tier in (getattr(self.policy, "tiers_ms", None) or ()) else tpot_tier(tier)

    def observe_output(self, call: GenerateCall, completion_tokens: int) -> None:
        """Teach an online predictor (the default's histories) what this request's answer took."""
        self.mix.on_finished(self.tier_of(call.slo), completion_tokens, self.clock())
        observe = getattr(self.predictor, "observe", None)
        if observe is not None:
            observe(call.slo.program_id, completion_tokens, len(call.input_ids))

    def predict_output(self, call: GenerateCall) -> int | None:
        """The length predictor's estimate, at most the client's cap (None without one, or when it fails)."""
        if self.predictor is None:
            return None
        text = call.prompt_text
        if text is None and self.tokenizer.loaded:
            text = self.tokenizer.decode(call.input_ids)
        try:
            value = self.predictor.predict(text or "", len(call.input_ids), call.slo.program_id)
        except Exception:  # noqa: BLE001 - a broken predictor must not fail requests
            logger.exception("length predictor failed for %s", call.rid)
            return None
        if not math.isfinite(value):
            return None
        cap = call.max_new_tokens
        return max(1, min(math.ceil(value), cap if cap is not None else math.inf))

    def max_input_tokens(self) -> int | None:
        """The longest prompt any routable worker's model takes (None: no worker said)."""
        limits = []
        for v in self.healthy():
            reg = self.registry.registration(v.worker_id)
            if reg is not None and reg.max_input_tokens is not None and v.role != PREFILL:
                limits.append(reg.max_input_tokens)
        return max(limits) if limits else None

    async def submit(self, call: GenerateCall) -> RequestStream:
        """Route the request; NoWorkerAvailable when no worker within the admission timeout,
        PromptTooLong when no worker's model takes its prompt."""
        limit = self.max_input_tokens()
        if limit is not None and len(call.input_ids) > limit:
            raise PromptTooLong(f"{len(call.input_ids)} tokens: longer than the model's context ({limit} tokens)")
        submit = Submit(
            rid=call.rid,
            input_ids=tuple(call.input_ids),
            sampling_params=call.sampling_params,
            slo=call.slo,
            stream=call.stream,
            arrival_unix=call.arrival_unix,
        )
        route = self.route_request(call)
        self.mix.on_arrival(self.tier_of(call.slo), len(call.input_ids), self.clock())
        self.reports.begin(call.slo, call.arrival_unix)
        return await self.dispatcher.submit(route, submit)

    async def migrate(self, rid: str, target: str) -> dict[str, Any]:
        """Move a running request now (token-ID migration). KeyError: not running; ValueError: bad target."""
        source = self.registry.worker_of(rid)
        if source is None:
            raise KeyError(rid)
        if target not in self.registry.worker_ids():
            raise ValueError(f"unknown worker {target!r}")
        if not self.registry.is_alive(target):
            raise ValueError(f"worker {target!r} is not alive")
        moved = False if source == target else await self.dispatcher.migrate(rid, target)
        return {"rid": rid, "from": source, "to": target, "migrated": moved}

    # --- status ---

    def pd_sizing(self) -> dict[str, Any] | None:
        """The live prefill:decode split (router/pool_sizing.py), for status and metrics."""
        return self.sizer.sizing(self.views(), self.registry, self.clock())

    def status(self) -> dict[str, Any]:
        """GET /slo/status: policy, counters, every worker's view, per-policy signals, attainment."""
        workers = []
        for v in self.views():
            reg = self.registry.registration(v.worker_id)
            workers.append(
                {
                    **dataclasses.asdict(v),
                    "http_url": None if reg is None else reg.http_url,
                    "model": None if reg is None else reg.model,
                }
            )
        policy_status = getattr(self.policy, "status", None)
        return {
            "role": "router",
            "policy": self.config.routing_policy,
            "policy_params": self.config.policy_params,
            "uptime_s": None if self.started_unix is None else round(time.time() - self.started_unix, 3),
            "worker_address": None if self._endpoint is None else self._endpoint.address,
            "worker_link_encrypted": None if self._endpoint is None else self._endpoint.encrypted,
            "tokenizer": {"path": self.tokenizer.path, "loaded": self.tokenizer.loaded, "error": self.tokenizer.error},
            "length_predictor": None if self.predictor is None else getattr(self.predictor, "name", "custom"),
            "dispatcher": self._dispatcher_status(),
            "workers": workers,
            "policy_status": policy_status() if callable(policy_status) else None,
            "pd_sizing": self.pd_sizing(),
            "attainment": self.reports.attainment(),
            "tiers": self.reports.tiers(),
        }
