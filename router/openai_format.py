"""OpenAI response bodies and stream chunks, shaped as SGLang 0.5.17's OpenAI layer shapes them
(serving_completions.py, serving_chat.py, sse_utils.py), plus the `slo` block our single server
adds to the final response or the chunk that carries finish_reason.
"""

from __future__ import annotations

from typing import Any

from router.generation import Generation
from router.requests import OpenAIOptions


def usage(gen: Generation) -> dict[str, Any]:
    return {
        "prompt_tokens": gen.prompt_tokens,
        "total_tokens": gen.prompt_tokens + gen.completion_tokens,
        "completion_tokens": gen.completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }


def _finish(gen: Generation) -> tuple[str | None, Any]:
    reason = gen.finish_reason
    if reason is None:
        return None, None
    return reason.get("type"), reason.get("matched")


def _envelope(gen: Generation, opts: OpenAIOptions, created: int, kind: str) -> dict[str, Any]:
    return {"id": gen.call.rid, "object": kind, "created": created, "model": opts.model}


# --- /v1/completions ---


def completion_response(gen: Generation, opts: OpenAIOptions, created: int) -> dict[str, Any]:
    reason, matched = _finish(gen)
    return {
        **_envelope(gen, opts, created, "text_completion"),
        "choices": [{"index": 0, "text": gen.text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}],
        "usage": usage(gen),
        "metadata": None,
        "slo": gen.report,
    }


def completion_chunk(gen: Generation, opts: OpenAIOptions, created: int, delta: str) -> dict[str, Any]:
    """One streamed delta; the one with finish_reason also carries the `slo` block."""
    reason, matched = _finish(gen)
    chunk = {
        **_envelope(gen, opts, created, "text_completion"),
        "choices": [{"index": 0, "text": delta, "logprobs": None, "finish_reason": reason, "matched_stop": matched}],
        "usage": usage(gen) if opts.continuous_usage_stats else None,
    }
    if reason is not None:
        chunk["slo"] = gen.report
    return chunk


def usage_chunk(gen: Generation, opts: OpenAIOptions, created: int, kind: str) -> dict[str, Any]:
    """stream_options.include_usage: the extra last chunk with no choices."""
    return {**_envelope(gen, opts, created, kind), "choices": [], "usage": usage(gen)}


# --- /v1/chat/completions ---


def chat_response(gen: Generation, opts: OpenAIOptions, created: int) -> dict[str, Any]:
    reason, matched = _finish(gen)
    message = {"role": "assistant", "content": gen.text, "reasoning_content": None, "tool_calls": None}
    return {
        **_envelope(gen, opts, created, "chat.completion"),
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
        ],
        "usage": usage(gen),
        "metadata": None,
        "slo": gen.report,
    }


def chat_chunk(
    gen: Generation,
    opts: OpenAIOptions,
    created: int,
    *,
    role: str | None = None,
    content: str | None = None,
    final: bool = False,
) -> dict[str, Any]:
    """SGLang's chunk sequence: a role chunk, content deltas, then an empty-delta finish chunk."""
    delta: dict[str, Any] = {"reasoning_content": None}
    if role is not None:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    reason, matched = _finish(gen) if final else (None, None)
    chunk = {
        **_envelope(gen, opts, created, "chat.completion.chunk"),
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason, "matched_stop": matched}],
    }
    if opts.continuous_usage_stats and content:
        chunk["usage"] = usage(gen)
    if final:
        chunk["slo"] = gen.report
    return chunk
