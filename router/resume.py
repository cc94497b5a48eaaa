"""How a request continues on another worker after some of its tokens were delivered.

Resume convention (token-ID migration, GoodServe §3.4). A resubmitted request carries
`Submit.resume_output_ids` = every token the client has already received, and its
`sampling_params["max_new_tokens"]` (and `min_new_tokens`) reduced by that many. The worker
prefills prompt + resumed tokens and generates only the rest, and its `TokenChunk.completion_tokens`
counts ALL output tokens of the request, resumed ones included (as protocol.TokenChunk documents).
So a chunk's `token_ids` sit at output positions [completion_tokens - len(token_ids),
completion_tokens); router/worker_inbox.py places each chunk by that position.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from router.protocol import Submit
from router.routing_views import RouteRequest
from wire import ORACLE_HINT_PARAM


def _int_param(params: dict[str, Any], name: str) -> int | None:
    value = params.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def cap_reached(submit: Submit, generated: int) -> bool:
    """Whether `generated` tokens already use up the client's max_new_tokens (no resume needed)."""
    cap = _int_param(submit.sampling_params, "max_new_tokens")
    return cap is not None and cap - generated <= 0


def resume_submit(submit: Submit, delivered: list[int]) -> Submit:
    """The Submit that continues `submit` after `delivered` (callers check `cap_reached` first)."""
    if not delivered:
        return submit
    n = len(delivered)
    params = dict(submit.sampling_params)
    for name, floor in (("max_new_tokens", 1), ("min_new_tokens", 0)):
        value = _int_param(params, name)
        if value is not None:
            params[name] = max(floor, value - n)
    custom = params.get("custom_params")
    if isinstance(custom, dict) and _int_param(custom, ORACLE_HINT_PARAM) is not None:
        # a benchmark's hidden length counts the whole output; the new worker counts from zero
        params["custom_params"] = {**custom, ORACLE_HINT_PARAM: max(1, custom[ORACLE_HINT_PARAM] - n)}
    return replace(submit, sampling_params=params, resume_output_ids=tuple(delivered))


def resume_route(route: RouteRequest, generated: int) -> RouteRequest:
    """The request as the policy should see a resume: a longer prompt, fewer tokens to go."""
    if not generated:
        return route

    def less(value: int | None) -> int | None:
        return None if value is None else max(1, value - generated)

    return replace(
        route,
        prompt_tokens=route.prompt_tokens + generated,
        predicted_output_tokens=less(route.predicted_output_tokens),
        max_new_tokens=less(route.max_new_tokens),
    )
