"""Which client sampling parameters a worker may be handed: SGLang 0.5.17's own types and ranges.

SGLang builds `SamplingParams(**sampling_params)` from the client's dict without checking a type
(a msgspec Struct's constructor does not validate), and its `verify()` compares only ranges. A
value of the wrong type then travels on to the scheduler or the detokenizer process and fails
there, where an exception ends the process and with it every request on the worker: a string
bias in `logit_bias` cannot be stored in the bias tensor, a string `skip_special_tokens` cannot be
passed to the tokenizer's decode, a `top_k` past int32 or a seed past int64 cannot be made into
a tensor, a bias outside float32 turns the logits into infinities. Others end as a 500 (an
unknown key is a TypeError in the constructor, a string temperature one in verify).

So every key and value is checked here, before SGLang sees it, and a refusal names the field:
- only SamplingParams' API keys; bools are JSON true/false (the tokenizer's decode takes no 0/1),
  integers are integers (not bools, not 2.0), floats are finite numbers (a JSON integer is one);
- the ranges of `verify()`, and the bounds of the tensors the values go into;
- `logit_bias` maps token ids (decimal strings, as JSON keys are) to biases within +-100 (OpenAI's
  bound: a bias past it bans or forces a token just as well); `stop_token_ids` are token ids;
  token ids are checked against the vocabulary when the caller knows it;
- `n` is bounded: SGLang copies the prompt n times before anything else checks it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from scheduler.core.field_error import FieldError
from scheduler.core.regex_guard import UnsafeRegex, check_stop_regex

MAX_INT32 = 2**31 - 1
MAX_INT64 = 2**63 - 1
MAX_N = 128  # completions per request (OpenAI's bound)
MAX_LOGIT_BIAS = 100.0  # |bias| (OpenAI's bound)
MAX_STOPS = 64  # stop strings per request
MAX_STOP_CHARS = 1024  # length of one stop string (SGLang decodes that many tokens every step)
MAX_STOP_TOKEN_IDS = 1024
MAX_TOP_LOGPROBS = 1024
FLOAT32_MAX = 3.4028234663852886e38
GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")
_TOKEN_KEY = re.compile(r"[0-9]{1,10}")


class BadParam(FieldError):
    """A parameter SGLang would mishandle; `field` names it for the 400 (e.g. sampling_params.top_k)."""


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and abs(value) <= FLOAT32_MAX


def _number(lo: float, hi: float, lo_open: bool = False) -> Callable[[str, Any, int | None], None]:
    def check(field: str, value: Any, vocab: int | None) -> None:
        if not _is_number(value):
            raise BadParam(field, f"must be a finite number, got {value!r}")
        if value < lo or value > hi or (lo_open and value == lo):
            raise BadParam(field, f"must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {value!r}")

    return check


def _integer(lo: int, hi: int) -> Callable[[str, Any, int | None], None]:
    def check(field: str, value: Any, vocab: int | None) -> None:
        if not _is_int(value):
            raise BadParam(field, f"must be an integer, got {value!r}")
        if not lo <= value <= hi:
            raise BadParam(field, f"must be in [{lo}, {hi}], got {value!r}")

    return check


def _boolean(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, bool):
        raise BadParam(field, f"must be true or false, got {value!r}")


def _string(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, str):
        raise BadParam(field, f"must be a string, got {type(value).__name__}")


def _top_k(field: str, value: Any, vocab: int | None) -> None:
    if not _is_int(value) or not (value == -1 or 1 <= value <= MAX_INT32):
        raise BadParam(field, f"must be -1 (all tokens) or an integer in [1, {MAX_INT32}], got {value!r}")


def _token_id(field: str, value: Any, vocab: int | None) -> None:
    top = (vocab if vocab is not None else MAX_INT32 + 1) - 1
    if not _is_int(value) or not 0 <= value <= top:
        raise BadParam(field, f"must be a token id in [0, {top}], got {value!r}")


def _stop(field: str, value: Any, vocab: int | None) -> None:
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise BadParam(field, "must be a string or a list of strings")
    if len(stops) > MAX_STOPS:
        raise BadParam(field, f"at most {MAX_STOPS} stop strings")
    if any(len(s) > MAX_STOP_CHARS for s in stops):
        raise BadParam(field, f"a stop string is at most {MAX_STOP_CHARS} characters")


def _stop_token_ids(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, list):
        raise BadParam(field, "must be a list of token ids")
    if len(value) > MAX_STOP_TOKEN_IDS:
        raise BadParam(field, f"at most {MAX_STOP_TOKEN_IDS} token ids")
    for i, token in enumerate(value):
        _token_id(f"{field}[{i}]", token, vocab)


def _stop_regex(field: str, value: Any, vocab: int | None) -> None:
    try:
        check_stop_regex(value, field)
    except UnsafeRegex as exc:
        raise BadParam(exc.field, exc.message) from None


def _logit_bias(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, Mapping):
        raise BadParam(field, "must be an object mapping token ids to biases")
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and _TOKEN_KEY.fullmatch(key) else key
        _token_id(f"{field}.{key}", token, vocab)
        if not _is_number(bias) or abs(bias) > MAX_LOGIT_BIAS:
            raise BadParam(f"{field}.{key}", f"must be a number in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]")


def _custom_params(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise BadParam(field, "must be an object")


# SamplingParams' API keys (not its internal ones: stop_strs, is_normalized, ...). None is
# SGLang's "default" for each of them.
CHECKS: dict[str, Callable[[str, Any, int | None], None]] = {
    "max_new_tokens": _integer(0, MAX_INT32),
    "min_new_tokens": _integer(0, MAX_INT32),
    "stop": _stop,
    "stop_token_ids": _stop_token_ids,
    "stop_regex": _stop_regex,
    "temperature": _number(0.0, FLOAT32_MAX),
    "top_p": _number(0.0, 1.0, lo_open=True),
    "top_k": _top_k,
    "min_p": _number(0.0, 1.0),
    "frequency_penalty": _number(-2.0, 2.0),
    "presence_penalty": _number(-2.0, 2.0),
    "repetition_penalty": _number(0.0, 2.0, lo_open=True),
    "n": _integer(1, MAX_N),
    "json_schema": _string,
    "regex": _string,
    "ebnf": _string,
    "structural_tag": _string,
    "ignore_eos": _boolean,
    "skip_special_tokens": _boolean,
    "spaces_between_special_tokens": _boolean,
    "no_stop_trim": _boolean,
    "stream_interval": _integer(1, MAX_INT32),
    "logit_bias": _logit_bias,
    "sampling_seed": _integer(-(2**63), MAX_INT64),
    "custom_params": _custom_params,
    "watermark": _custom_params,  # an object (None from OpenAI routes); SGLang checks its fields
}


# Keys SGLang reads around the SamplingParams defaults: `n` is the request's parallel sample count
# (`sampling_params.get("n", 1)`), so an explicit null reaches a comparison and is a TypeError.
NOT_NULL = frozenset({"n"})


def check_sampling_value(key: str, value: Any, field: str, vocab_size: int | None = None) -> None:
    """Refuse (BadParam naming `field`) one sampling parameter SGLang would mishandle; an
    unknown key is refused too. None is SGLang's default for every key but NOT_NULL's."""
    check = CHECKS.get(key)
    if check is None:
        raise BadParam(field, "is not a sampling parameter")
    if value is None and key in NOT_NULL:
        raise BadParam(field, "must not be null (leave it out for the default)")
    if value is not None:
        check(field, value, vocab_size)


def check_sampling_params(params: Any, field: str = "sampling_params", vocab_size: int | None = None) -> None:
    """Refuse (BadParam naming `field.key`, or `field[i].key` in a batch) a native
    `sampling_params` value: None, an object, or a non-empty list of objects."""
    if params is None:
        return
    if isinstance(params, list):
        if not params:
            raise BadParam(field, "must be an object or a non-empty list of objects")
        for i, one in enumerate(params):
            check_sampling_params(one if one is not None else {}, f"{field}[{i}]", vocab_size)
        return
    if not isinstance(params, dict):
        raise BadParam(field, "must be an object")
    for key, value in params.items():
        check_sampling_value(str(key), value, f"{field}.{key}", vocab_size)
    low, high = params.get("min_new_tokens"), params.get("max_new_tokens")
    if type(low) is int and type(high) is int and low > high:
        raise BadParam(f"{field}.min_new_tokens", f"must be at most max_new_tokens ({high})")
    grammars = [name for name in GRAMMARS if params.get(name)]
    if len(grammars) > 1:
        raise BadParam(f"{field}.{grammars[1]}", f"only one of {', '.join(GRAMMARS)} may be set")


# --- GenerateReqInput's own fields (native /generate): the ones whose wrong type fails past the
# HTTP process (the scheduler, the detokenizer) or inside SGLang's batch normalisation.
_BOOL_FIELDS = (
    "stream",
    "return_text_in_logprobs",
    "return_routed_experts",
    "return_entropy",
    "return_prompt_token_ids",
    "return_bytes",
)


def _one_or_batch(field: str, value: Any, check: Callable[[str, Any, int | None], None], vocab: int | None) -> None:
    if isinstance(value, list):
        if not value:
            raise BadParam(field, "must not be an empty list")
        for i, one in enumerate(value):
            if one is not None:
                check(f"{field}[{i}]", one, vocab)
    else:
        check(field, value, vocab)


def _hidden_states(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, bool) and value != "last":
        raise BadParam(field, f'must be true, false or "last", got {value!r}')


def _token_ids_logprob(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, list):
        raise BadParam(field, "must be a list of token ids or a list of such lists")
    rows = value if value and isinstance(value[0], list) else [value]
    for i, row in enumerate(rows):
        _stop_token_ids(f"{field}[{i}]" if rows is value else field, row, vocab)


def _text(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, str) and not (
        isinstance(value, list) and value and all(isinstance(t, str) for t in value)
    ):
        raise BadParam(field, "must be a string or a non-empty list of strings")


def _embeds(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, list) or not value or not isinstance(value[0], list) or not value[0]:
        raise BadParam(field, "must be a non-empty list of embedding rows")


# SGLang 0.5.17's SessionParams (io_struct): an unknown key or a wrong type is a TypeError there.
SESSION_FIELDS: dict[str, Callable[[str, Any, int | None], None]] = {
    "id": _string,
    "rid": _string,
    "offset": _integer(0, MAX_INT32),
    "replace": _boolean,
    "drop_previous_output": _boolean,
}


def _session_params(field: str, value: Any, vocab: int | None) -> None:
    if not isinstance(value, Mapping):
        raise BadParam(field, "must be an object")
    for key, one in value.items():
        check = SESSION_FIELDS.get(key) if isinstance(key, str) else None
        if check is None:
            raise BadParam(f"{field}.{key}", f"unknown field (allowed: {', '.join(SESSION_FIELDS)})")
        if one is not None:
            check(f"{field}.{key}", one, vocab)


GENERATE_CHECKS: dict[str, Callable[[str, Any, int | None], None]] = {
    "session_params": _session_params,
    "text": _text,
    "input_embeds": _embeds,
    "return_hidden_states": lambda f, v, n: _one_or_batch(f, v, _hidden_states, n),
    "return_logprob": lambda f, v, n: _one_or_batch(f, v, _boolean, n),
    "logprob_start_len": lambda f, v, n: _one_or_batch(f, v, _integer(-1, MAX_INT32), n),
    "top_logprobs_num": lambda f, v, n: _one_or_batch(f, v, _integer(0, MAX_TOP_LOGPROBS), n),
    "token_ids_logprob": lambda f, v, n: _token_ids_logprob(f, v, n) if v != [] else None,
    **{name: _boolean for name in _BOOL_FIELDS},
}


# Fields SGLang hands to each scheduler Req as they are: a string per request, so a list is only
# a batch's (one per prompt); a list in a single request reaches Req() and kills the scheduler.
PER_REQUEST_STRINGS = ("lora_path", "lora_id", "extra_key", "routing_key")


def _is_batch(body: Mapping[str, Any]) -> bool:
    ids = body.get("input_ids")
    return isinstance(body.get("text"), list) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], list))


def _per_request_string(field: str, value: Any, batch: bool) -> None:
    if isinstance(value, str):
        return
    if batch and isinstance(value, list) and all(v is None or isinstance(v, str) for v in value):
        return
    raise BadParam(field, "must be a string" + (" or a list of strings, one per prompt" if batch else ""))


def check_generate_fields(body: Mapping[str, Any], vocab_size: int | None = None, prefix: str = "") -> None:
    """Refuse (BadParam naming the field, after `prefix`) a native GenerateReqInput whose
    sampling params or typed fields SGLang would mishandle; other fields are SGLang's to judge."""
    for name, check in GENERATE_CHECKS.items():
        if body.get(name) is not None:
            check(f"{prefix}{name}", body[name], vocab_size)
    batch = _is_batch(body)
    for name in PER_REQUEST_STRINGS:
        if body.get(name) is not None:
            _per_request_string(f"{prefix}{name}", body[name], batch)
    check_sampling_params(body.get("sampling_params"), f"{prefix}sampling_params", vocab_size)
