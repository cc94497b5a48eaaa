"""The OpenAI routes' own body fields (model, prompt, messages, stream options, response format),
each checked with a 400 naming the field; sampling fields are checked with the native ones."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from router.api_error import bad


def response_format(body: Mapping[str, Any], params: dict[str, Any]) -> None:
    """OpenAI's response_format as SGLang's json_schema constraint in `params`."""
    fmt = body.get("response_format")
    if fmt is None:
        return
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return
    if kind == "json_object":
        params["json_schema"] = '{"type": "object"}'
    elif kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        schema = fmt["json_schema"].get("schema", fmt["json_schema"].get("schema_"))
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "must be an object")
        params["json_schema"] = json.dumps(schema)
    else:
        raise bad("response_format", "supported types: text, json_object, json_schema")


def stream_options(body: Mapping[str, Any], stream: bool) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats), only with a stream."""
    opts = body.get("stream_options")
    if opts is None:
        return False, False
    if not isinstance(opts, dict):
        raise bad("stream_options", "must be an object")
    if not stream:
        raise bad("stream_options", "only allowed when stream is true")
    return bool(opts.get("include_usage")), bool(opts.get("continuous_usage_stats"))


def model_name(body: Mapping[str, Any]) -> str:
    """The model the client named (any name is served by the one model behind the router)."""
    model = body.get("model")
    if model is None:
        return "default"
    if not isinstance(model, str):
        raise bad("model", "must be a string")
    return model


def single_prompt(prompt: Any) -> str | list[int]:
    """The one prompt of /v1/completions: text or token ids (a batch of one is one request)."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one is one request
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad("prompt", "batches are not supported by the router: send one prompt per request")
    raise bad("prompt", "must be a string or a non-empty list of token ids")


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The chat messages with text content only, each part's text joined."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "must be a non-empty list of messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise bad(f"messages[{i}]", "must be an object with a string role")
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"messages[{i}].content[{j}]", "only text parts are supported by the router")
                parts.append(part["text"])
            content = "".join(parts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise bad(f"messages[{i}].content", "must be a string or a list of text parts")
        out.append({**msg, "content": content})
    return out
