"""Client request bodies -> GenerateCall: validation with 400s that name the field.

The router accepts what one SGLang worker accepts on /generate, /v1/completions and
/v1/chat/completions, except features it cannot carry across workers (logprobs, hidden states,
multimodal input, LoRA, sessions, batches, n > 1): those are a 400 naming the field when set to
anything but their "off" value, so clients that send the defaults explicitly (bench_serving sends
`return_logprob: false`, `lora_path: null`) work unchanged. Unknown fields are ignored, as SGLang
ignores them. Sampling parameters go to the worker's SGLang as they are; it validates them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from router.access import OPEN_ACCESS, Principal
from router.api_error import ApiError, bad
from router.openai_fields import chat_messages, model_name, response_format, single_prompt, stream_options
from router.service import GenerateCall
from router.tokenizer import RouterTokenizer, TokenizerBusy, TokenizeTimeout, input_chars
from scheduler.core.regex_guard import UnsafeRegex, check_stop_regex
from scheduler.core.sampling_guard import BadParam, check_sampling_params, check_sampling_value
from scheduler.core.slo import SloSpec, SloValidationError
from scheduler.core.slo_limits import SloLimitError, hold_to_key
from scheduler.core.slo_wire import extract_slo
from wire import (
    ARRIVAL_PARAM,
    INTERNAL_PARAM_PREFIX,
    ORACLE_HINT_PARAM,
    SLO_PARAM,
)

DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams default (native route)
DEFAULT_COMPLETION_MAX_TOKENS = 16  # SGLang's CompletionRequest default (OpenAI's too)
MAX_RID_LEN = 256
TOKENIZE_TIMEOUT_S = 10.0
# chat_template_kwargs a template may read (SGLang's documented switches); anything else could
# steer a template into work or output nobody reviewed.
TEMPLATE_KWARGS = ("enable_thinking", "thinking", "reasoning_effort")
MAX_TEMPLATE_VALUE_LEN = 64

# Native fields the router cannot serve: rejected unless falsy (False, None, 0, "", [], {}).
NATIVE_UNSUPPORTED = (
    "return_logprob",
    "top_logprobs_num",
    "token_ids_logprob",
    "input_embeds",
    "image_data",
    "video_data",
    "audio_data",
    "lora_path",
    "lora_id",
    "return_hidden_states",
    "return_routed_experts",
    "return_entropy",
    "return_bytes",
    "return_prompt_token_ids",
    "session_params",
    "custom_logit_processor",
    "background",
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
)
COMPLETION_UNSUPPORTED = ("echo", "logprobs", "suffix", "return_hidden_states", "lora_path")
CHAT_UNSUPPORTED = (
    "tools",
    "functions",
    "logprobs",
    "top_logprobs",
    "continue_final_message",
    "return_hidden_states",
    "lora_path",
)
# OpenAI request field -> SGLang sampling parameter (as SGLang's own OpenAI layer maps them)
OPENAI_SAMPLING = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "repetition_penalty": "repetition_penalty",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "stop_regex": "stop_regex",
    "min_tokens": "min_new_tokens",
    "ignore_eos": "ignore_eos",
    "skip_special_tokens": "skip_special_tokens",
    "spaces_between_special_tokens": "spaces_between_special_tokens",
    "no_stop_trim": "no_stop_trim",
    "regex": "regex",
    "ebnf": "ebnf",
    "json_schema": "json_schema",
    "logit_bias": "logit_bias",
    "seed": "sampling_seed",
    "custom_params": "custom_params",
}

TokenizerSource = Callable[[], Awaitable[RouterTokenizer]]


@dataclass(frozen=True)
class ParseContext:
    """What a body is read against, whatever its route: the request's headers (lower-cased),
    the router's tokenizer and default SLO, when the request arrived and who sent it."""

    headers: Mapping[str, str]
    tokenizer: TokenizerSource
    default_slo: SloSpec | None = None
    arrival: tuple[float, float] | None = None  # (wall clock, router clock); None: now
    principal: Principal | None = None

    def arrived(self) -> tuple[float, float]:
        return self.arrival or (time.time(), time.monotonic())


@dataclass(frozen=True)
class OpenAIOptions:
    """What the OpenAI formatter needs beyond the GenerateCall."""

    model: str
    include_usage: bool = False
    continuous_usage_stats: bool = False


# --- shared field checks ---


def _falsy_or_fail(body: Mapping[str, Any], names: tuple[str, ...], why: str) -> None:
    for name in names:
        if body.get(name):
            raise bad(name, why)


def _opt_bool(body: Mapping[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(name, f"must be a boolean, got {type(value).__name__}")
    return value


def _rid(body: Mapping[str, Any]) -> str:
    rid = body.get("rid")
    if rid is None:
        return uuid.uuid4().hex
    if isinstance(rid, list):
        raise bad("rid", "batches are not supported by the router: send one request per rid")
    if not isinstance(rid, str) or not 0 < len(rid) <= MAX_RID_LEN:
        raise bad("rid", f"must be a string of 1..{MAX_RID_LEN} chars")
    return rid


def _token_ids(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise bad(name, "must be a non-empty list of token ids")
    if any(isinstance(t, list) for t in value):
        raise bad(name, "batches are not supported by the router: send one prompt per request")
    for i, tok in enumerate(value):
        if type(tok) is not int or not 0 <= tok < 2**31:
            raise bad(f"{name}[{i}]", f"must be a non-negative token id, got {tok!r}")
    return value


def _count(value: Any, name: str) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise bad(name, f"must be a non-negative integer, got {value!r}")
    return value


def _strip_slo(custom: Any, name: str) -> Any:
    """The SLO travels in Submit.slo and the arrival in Submit.arrival_unix; the worker must not
    see a second, stale copy, nor any other internal `slo_*` key a client set (the worker trusts
    what the router's agent forwards). The benchmark length hint stays: it ends the request there."""
    if custom is None:
        return None
    if not isinstance(custom, dict):
        raise bad(name, "must be an object")
    kept = {
        k: v
        for k, v in custom.items()
        if k not in (SLO_PARAM, ARRIVAL_PARAM)
        and (not str(k).startswith(INTERNAL_PARAM_PREFIX) or k == ORACLE_HINT_PARAM)
    }
    return kept or None


def _strip_custom_slo(params: dict[str, Any], name: str) -> None:
    """Drop the client's `slo_*` keys from `params["custom_params"]` (the SLO travels on its own)."""
    custom = _strip_slo(params.get("custom_params"), name)
    if custom is None:
        params.pop("custom_params", None)
    else:
        params["custom_params"] = custom


def _stop_regex(value: Any, field: str) -> None:
    """SGLang runs stop patterns inside its scheduler loop: only boundedly costly ones pass
    (scheduler.core.regex_guard)."""
    try:
        check_stop_regex(value, field)
    except UnsafeRegex as exc:
        raise bad(exc.field, exc.message) from None


def _sampling(check: Callable[[], None]) -> None:
    """A value of the wrong type or range would crash or 500 the worker (scheduler.core.sampling_guard)."""
    try:
        check()
    except BadParam as exc:
        raise bad(exc.field, exc.message) from None


def _slo(body: dict[str, Any], headers: Mapping[str, str], default: SloSpec | None, native: bool) -> SloSpec:
    try:
        return extract_slo(body, headers, default, native=native)
    except SloValidationError as exc:
        raise bad(exc.field, exc.message) from None


def _hold_to_key(
    spec: SloSpec, params: dict[str, Any], principal: Principal | None
) -> tuple[SloSpec, dict[str, Any] | None]:
    """The caller's key limits, program namespace and fair share on this request (after the
    client's `slo_*` custom params were stripped); nothing without a key (no caller, or no key
    configured at all). 403 naming the field when the key may not ask for this SLO."""
    if principal is None or principal is OPEN_ACCESS:
        return spec, None
    custom = params.get("custom_params")
    if custom is None:
        custom = params["custom_params"] = {}
    try:
        spec, clamped = hold_to_key(spec, principal.name, principal.limits, principal.share, custom)
    except SloLimitError as exc:
        raise ApiError(403, exc.message, exc.field, kind="permission_error") from None
    return spec, clamped or None


async def _encode(tokenizer: RouterTokenizer, text: str, name: str) -> list[int]:
    try:
        ids = await tokenizer.run(lambda: tokenizer.encode(text), TOKENIZE_TIMEOUT_S, size=len(text))
    except TokenizerBusy as exc:
        raise ApiError.from_shed(exc.shed) from None
    except TokenizeTimeout as exc:
        raise bad(name, f"tokenizing {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a tokenizer failure is the input's fault here
        raise bad(name, f"cannot be tokenized: {exc}") from None
    if not ids:
        raise bad(name, "tokenizes to no tokens")
    return ids


def template_kwargs(value: Any) -> dict[str, Any]:
    """chat_template_kwargs, allow-listed: known switches with short scalar values."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad("chat_template_kwargs", "must be an object")
    for key, item in value.items():
        if key not in TEMPLATE_KWARGS:
            raise bad(f"chat_template_kwargs.{key}", f"not allowed (allowed: {', '.join(TEMPLATE_KWARGS)})")
        scalar = item is None or isinstance(item, (bool, int, float)) or isinstance(item, str)
        if not scalar or (isinstance(item, str) and len(item) > MAX_TEMPLATE_VALUE_LEN):
            raise bad(
                f"chat_template_kwargs.{key}",
                f"must be a boolean, a number or a string of <= {MAX_TEMPLATE_VALUE_LEN} chars",
            )
    return value


# --- native /generate ---


async def parse_native(body: dict[str, Any], ctx: ParseContext) -> GenerateCall:
    """SGLang's GenerateReqInput, single request only."""
    arrival_unix, arrival_s = ctx.arrived()
    text, ids = body.get("text"), body.get("input_ids")
    if text is not None and ids is not None:
        raise bad("input_ids", "give either text or input_ids, not both")
    if text is None and ids is None:
        raise bad("text", "missing: give text or input_ids")
    if text is not None and not isinstance(text, str):
        raise bad("text", "batches are not supported by the router: send one prompt per request")
    if ids is not None:
        ids = _token_ids(ids, "input_ids")
    _falsy_or_fail(body, NATIVE_UNSUPPORTED, "not supported by the router")
    params = body.get("sampling_params")
    if params is None:
        params = {}
    if isinstance(params, list):
        raise bad("sampling_params", "batches are not supported by the router: send one object")
    if not isinstance(params, dict):
        raise bad("sampling_params", "must be an object")
    params = dict(params)
    if "max_new_tokens" not in params:
        params["max_new_tokens"] = DEFAULT_MAX_NEW_TOKENS
    _count(params["max_new_tokens"], "sampling_params.max_new_tokens")
    if params.get("n") not in (None, 1):
        raise bad("sampling_params.n", "must be 1: the router serves one completion per request")
    _stop_regex(params.get("stop_regex"), "sampling_params.stop_regex")
    _sampling(lambda: check_sampling_params(params, "sampling_params"))
    stream = _opt_bool(body, "stream")
    rid = _rid(body)
    spec = _slo(body, ctx.headers, ctx.default_slo, native=True)  # reads custom_params.slo before it is stripped
    _strip_custom_slo(params, "sampling_params.custom_params")
    spec, clamped = _hold_to_key(spec, params, ctx.principal)
    field = "input_ids" if ids is not None else "text"
    if ids is None:
        assert text is not None  # checked above: exactly one of the two was given
        ids = await _encode(await ctx.tokenizer(), text, "text")
    return GenerateCall(
        rid,
        ids,
        params,
        spec,
        stream,
        arrival_unix,
        arrival_s,
        prompt_text=text,
        prompt_field=field,
        slo_clamped=clamped,
    )


# --- OpenAI ---


def _openai_sampling(body: Mapping[str, Any], max_tokens: int | None) -> dict[str, Any]:
    params: dict[str, Any] = {"max_new_tokens": max_tokens}
    for name, param in OPENAI_SAMPLING.items():
        if body.get(name) is not None:
            _sampling(partial(check_sampling_value, param, body[name], name))
            params[param] = body[name]
    if body.get("n") not in (None, 1):
        raise bad("n", "must be 1: the router serves one completion per request")
    if "stop" in params and not isinstance(params["stop"], (str, list)):
        raise bad("stop", "must be a string or a list of strings")
    _stop_regex(body.get("stop_regex"), "stop_regex")
    _strip_custom_slo(params, "custom_params")
    return params


def _openai_params(body: Mapping[str, Any], max_tokens: Any, name: str) -> dict[str, Any]:
    """The sampling params of an OpenAI route: the token cap (named `name`), sampling, response_format."""
    _count(max_tokens, name)
    params = _openai_sampling(body, max_tokens)
    response_format(body, params)
    return params


async def _parse_openai(
    body: dict[str, Any],
    ctx: ParseContext,
    arrival: tuple[float, float],
    params: dict[str, Any],
    prompt_field: str,
    tokens: Callable[[], Awaitable[tuple[list[int], str | None]]],
) -> tuple[GenerateCall, OpenAIOptions]:
    """What the OpenAI routes share once their prompt and sampling params are checked: stream,
    rid, the SLO held to the caller's key, then the prompt's tokens (and its text, if sent)."""
    stream = _opt_bool(body, "stream")
    include_usage, continuous = stream_options(body, stream)
    model, rid = model_name(body), _rid(body)
    spec = _slo(body, ctx.headers, ctx.default_slo, native=False)
    spec, clamped = _hold_to_key(spec, params, ctx.principal)
    ids, text = await tokens()
    call = GenerateCall(
        rid,
        ids,
        params,
        spec,
        stream,
        *arrival,
        prompt_text=text,
        prompt_field=prompt_field,
        slo_clamped=clamped,
    )
    return call, OpenAIOptions(model, include_usage, continuous)


async def parse_completion(body: dict[str, Any], ctx: ParseContext) -> tuple[GenerateCall, OpenAIOptions]:
    """POST /v1/completions."""
    arrival = ctx.arrived()
    if "prompt" not in body:
        raise bad("prompt", "missing")
    prompt = single_prompt(body["prompt"])
    _falsy_or_fail(body, COMPLETION_UNSUPPORTED, "not supported by the router")
    if body.get("best_of") not in (None, 1):
        raise bad("best_of", "must be 1: the router serves one completion per request")
    params = _openai_params(body, body.get("max_tokens", DEFAULT_COMPLETION_MAX_TOKENS), "max_tokens")

    async def tokens() -> tuple[list[int], str | None]:
        if isinstance(prompt, str):
            return await _encode(await ctx.tokenizer(), prompt, "prompt"), prompt
        return _token_ids(prompt, "prompt"), None

    return await _parse_openai(body, ctx, arrival, params, "prompt", tokens)


async def parse_chat(body: dict[str, Any], ctx: ParseContext) -> tuple[GenerateCall, OpenAIOptions]:
    """POST /v1/chat/completions: the tokenizer's chat template with add_generation_prompt."""
    arrival = ctx.arrived()
    messages = chat_messages(body)
    _falsy_or_fail(body, CHAT_UNSUPPORTED, "not supported by the router")
    max_tokens = body.get("max_completion_tokens")
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = body.get("max_tokens"), "max_tokens"
    params = _openai_params(body, max_tokens, name)
    kwargs = template_kwargs(body.get("chat_template_kwargs"))

    async def tokens() -> tuple[list[int], str | None]:
        return await _render_chat(await ctx.tokenizer(), messages, kwargs), None

    return await _parse_openai(body, ctx, arrival, params, "messages", tokens)


async def _render_chat(tok: RouterTokenizer, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> list[int]:
    try:
        ids = await tok.run(lambda: tok.chat_ids(messages, **kwargs), TOKENIZE_TIMEOUT_S, size=input_chars(messages))
    except TokenizerBusy as exc:
        raise ApiError.from_shed(exc.shed) from None
    except TokenizeTimeout as exc:
        raise bad("messages", f"rendering the chat template {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a template that rejects the messages is the input's fault
        raise bad("messages", f"the chat template failed: {type(exc).__name__}: {exc}") from None
    if not ids:
        raise bad("messages", "the chat template produced no tokens")
    return ids
