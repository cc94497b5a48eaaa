"""The router's own tokenizer: it turns text and chat messages into token ids (workers only take
ids, and routing needs the prompt length and prefix before a worker is chosen) and turns the
token ids workers stream back into text.

Text is made in the router, never taken from a worker: a request that moved between workers has
one token sequence but several detokenizer states, and only the router sees the whole sequence.
`IncrementalDetokenizer` follows SGLang's detokenizer: decode a small window (the tokens of the
previous delta plus the new ones), emit what the window adds, and hold text back while it ends in
U+FFFD (a multi-byte character split across tokens). Each step costs O(window), not O(output).

The Hugging Face tokenizer loads lazily in a thread: importing transformers and reading a
tokenizer takes seconds, and the event loop must keep answering worker heartbeats meanwhile.
For the same reason a request's prompt is tokenized (and its chat template rendered) on a small
pool of threads with a time limit (`run`): a huge or hostile input costs that request a 400,
never the other streams' latency.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

REPLACEMENT = "\ufffd"
TOKENIZE_THREADS = 2  # requests tokenized at once; the event loop never waits on one
T = TypeVar("T")
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded before the output, as SGLang does (leading spaces)


class TokenizerUnavailable(RuntimeError):
    """No tokenizer path is known yet, or it failed to load; the HTTP layer answers 503."""


class TokenizeTimeout(TimeoutError):
    """Tokenizing one request took longer than its limit; the HTTP layer answers 400."""


def load_hf_tokenizer(path: str) -> Any:
    """AutoTokenizer from a local folder (the workers' model path); never downloads."""
    if not os.path.exists(path):  # a worker's path, on another machine
        raise FileNotFoundError(
            f"{path} is not on the router's machine: start the router with --tokenizer-path "
            "(a local folder with the model's tokenizer files)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path, local_files_only=True)


def render_chat_fallback(messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
    """`role: content` lines, for tokenizers without a chat template."""
    lines = [f"{m['role']}: {m['content']}" for m in messages]
    if add_generation_prompt:
        lines.append("assistant:")
    return "\n".join(lines)


class RouterTokenizer:
    """A lazily loaded Hugging Face tokenizer; `ensure(path)` must have succeeded before use."""

    def __init__(
        self, path: str | None = None, *, tokenizer: Any = None, loader: Callable[[str], Any] = load_hf_tokenizer
    ):
        self.path = path
        self._hf = tokenizer
        self._loader = loader
        self._lock = threading.Lock()
        self.error: str | None = None  # the last load failure, for /slo/status
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, work: Callable[[], T], timeout_s: float) -> T:
        """`work` (tokenizing, templating) on the tokenizer's threads; TokenizeTimeout past
        `timeout_s` (the thread finishes on its own, the request has its answer)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(TOKENIZE_THREADS, thread_name_prefix="router-tokenize")
        future = asyncio.get_running_loop().run_in_executor(self._pool, work)
        try:
            return await asyncio.wait_for(future, timeout_s)
        except asyncio.TimeoutError:
            raise TokenizeTimeout(f"took longer than {timeout_s:g} s") from None

    @property
    def loaded(self) -> bool:
        return self._hf is not None

    @property
    def hf(self) -> Any:
        if self._hf is None:
            raise TokenizerUnavailable("tokenizer not loaded yet")
        return self._hf

    async def ensure(self, path: str | None) -> None:
        """Load from `self.path` (or `path` when none was configured) in a worker thread, once."""
        if self._hf is not None:
            return
        target = self.path or path
        if not target:
            raise TokenizerUnavailable("no tokenizer path: pass --tokenizer-path or wait for a worker to register")
        await asyncio.to_thread(self._load, target)

    def _load(self, path: str) -> None:
        with self._lock:
            if self._hf is not None:
                return
            try:
                self._hf = self._loader(path)
            except Exception as exc:  # noqa: BLE001 - any load failure is the same 503 to clients
                self.error = f"cannot load tokenizer from {path}: {type(exc).__name__}: {exc}"
                raise TokenizerUnavailable(self.error) from exc
            self.path, self.error = path, None

    # --- text -> ids ---

    def encode(self, text: str) -> list[int]:
        """Like SGLang: the tokenizer's own special tokens (BOS) included."""
        return list(self.hf.encode(text))

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def chat_ids(self, messages: Sequence[dict[str, Any]], **template_kwargs: Any) -> list[int]:
        """The chat template with add_generation_prompt; the rendered text already has its specials."""
        if self.has_chat_template:
            text = self.hf.apply_chat_template(
                list(messages), tokenize=False, add_generation_prompt=True, **template_kwargs
            )
            return list(self.hf.encode(text, add_special_tokens=False))
        return self.encode(render_chat_fallback(messages))

    # --- ids -> text ---

    def decode(
        self, ids: Sequence[int], skip_special_tokens: bool = True, spaces_between_special_tokens: bool = True
    ) -> str:
        kwargs: dict[str, Any] = {"skip_special_tokens": skip_special_tokens}
        if not spaces_between_special_tokens:  # only slow tokenizers read it; keep the default call plain
            kwargs["spaces_between_special_tokens"] = False
        return self.hf.decode(list(ids), **kwargs)

    def detokenizer(
        self,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> IncrementalDetokenizer:
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:]) if prompt_ids else []
        return IncrementalDetokenizer(
            lambda ids: self.decode(ids, skip_special_tokens, spaces_between_special_tokens), context
        )


class IncrementalDetokenizer:
    """Token-id deltas in, text deltas out; the concatenated deltas equal decoding all ids at once.

    `context` ids (the prompt's tail) are decoded with the first window but never emitted: they
    give the first output token its correct leading space.
    """

    def __init__(self, decode: Callable[[list[int]], str], context: Sequence[int] = ()) -> None:
        self._decode = decode
        self._ids: list[int] = list(context)
        self._surr = 0  # window start: the previous delta's first token
        self._read = len(self._ids)  # end of what has been emitted
        self.text = ""  # everything emitted so far
        self.output_ids = 0

    def push(self, ids: Sequence[int]) -> str:
        """Feed new ids; returns the text they complete (may be "" while a character is split)."""
        if not ids:
            return ""
        self._ids.extend(ids)
        self.output_ids += len(ids)
        before = self._decode(self._ids[self._surr : self._read])
        window = self._decode(self._ids[self._surr :])
        if len(window) <= len(before) or window.endswith(REPLACEMENT):
            return ""
        delta = window[len(before) :]
        self._surr, self._read = self._read, len(self._ids)
        self.text += delta
        return delta

    def finish(self, ids: Sequence[int] = (), matched_stop: str | None = None, no_stop_trim: bool = False) -> str:
        """Take the last ids, emit everything held back (split characters stay U+FFFD) and trim a
        matched stop string.

        Like SGLang, the output is cut at the stop string's first occurrence (after it with
        no_stop_trim); text already emitted cannot be taken back, so only the unemitted tail is cut.
        """
        self._ids.extend(ids)
        self.output_ids += len(ids)
        before = self._decode(self._ids[self._surr : self._read])
        window = self._decode(self._ids[self._surr :])
        full = self.text + window[len(before) :]
        if matched_stop:
            pos = full.find(matched_stop)
            if pos != -1:
                full = full[: pos + len(matched_stop)] if no_stop_trim else full[:pos]
        delta = full[len(self.text) :]
        self._surr = self._read = len(self._ids)
        self.text += delta
        return delta
