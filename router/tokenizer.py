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
For the same reason a request's prompt is tokenized (and its chat template rendered) on threads
(`run`), in two lanes by input size so that a few huge prompts cannot hold every thread while
short ones wait: an input longer than `max_input_chars` is refused before it queues (400), one
that runs past its limit counted from when it started gets a 400 (its thread cannot be stopped
and finishes on its own, in its lane), and one that waits past `queue_timeout_s` for a thread
never runs and gets a 503 with Retry-After: the router is busy, the input is not at fault.
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import orjson

from scheduler.core.shed_wire import Shed
from wire import QUEUE_TIMEOUT

REPLACEMENT = "\ufffd"
TOKENIZE_THREADS = 2  # short inputs tokenized at once; the event loop never waits on one
LARGE_TOKENIZE_THREADS = 1  # long inputs have a lane of their own
LARGE_INPUT_CHARS = 32 * 1024  # inputs longer than this go to the long lane
MAX_INPUT_CHARS = 2 * 1024 * 1024  # longer inputs are refused before they queue
QUEUE_TIMEOUT_S = 5.0  # longest wait for a tokenizer thread before the request gets a 503
T = TypeVar("T")
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded before the output, as SGLang does (leading spaces)


class TokenizerUnavailable(RuntimeError):
    """No tokenizer path is known yet, or it failed to load; the HTTP layer answers 503."""


class TokenizeTimeout(TimeoutError):
    """Tokenizing one request took longer than its limit once started; the HTTP layer answers 400."""


class InputTooLong(ValueError):
    """An input longer than the tokenizer takes; refused before it queues (400)."""


class TokenizerBusy(RuntimeError):
    """No tokenizer thread took the request within the queue limit: a 503 with Retry-After."""

    def __init__(self, waited_s: float) -> None:
        super().__init__(f"the router's tokenizer threads were busy for {waited_s:g} s")
        self.shed = Shed(QUEUE_TIMEOUT, max(1, math.ceil(waited_s)), code="router_tokenizer_busy")


def input_chars(value: Any) -> int:
    """The size of a prompt or chat messages in characters (JSON length for structures)."""
    if isinstance(value, str):
        return len(value)
    try:
        return len(orjson.dumps(value))
    except (TypeError, orjson.JSONEncodeError):
        return 0  # not JSON: the template refuses it, quickly


class _Job:
    """One queued piece of work: it runs only if it starts before the caller gave up on it."""

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.lock = threading.Lock()
        self.started_at: float | None = None  # time.monotonic() when a thread took it
        self.abandoned = False

    def __call__(self) -> Any:
        with self.lock:
            if self.abandoned:
                return None
            self.started_at = time.monotonic()
        return self.work()

    def abandon_if_queued(self) -> bool:
        with self.lock:
            if self.started_at is None:
                self.abandoned = True
            return self.abandoned


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
        self,
        path: str | None = None,
        *,
        tokenizer: Any = None,
        loader: Callable[[str], Any] = load_hf_tokenizer,
        queue_timeout_s: float = QUEUE_TIMEOUT_S,
        max_input_chars: int = MAX_INPUT_CHARS,
        large_input_chars: int = LARGE_INPUT_CHARS,
    ):
        self.path = path
        self._hf = tokenizer
        self._loader = loader
        self._lock = threading.Lock()
        self.error: str | None = None  # the last load failure, for /slo/status
        self.queue_timeout_s = queue_timeout_s
        self.max_input_chars = max_input_chars
        self.large_input_chars = large_input_chars
        self._pools: dict[bool, ThreadPoolExecutor] = {}  # large? -> its lane

    def _lane(self, large: bool) -> ThreadPoolExecutor:
        pool = self._pools.get(large)
        if pool is None:
            threads, name = (LARGE_TOKENIZE_THREADS, "long") if large else (TOKENIZE_THREADS, "short")
            pool = self._pools[large] = ThreadPoolExecutor(threads, thread_name_prefix=f"router-tokenize-{name}")
        return pool

    async def run(self, work: Callable[[], T], timeout_s: float, size: int = 0) -> T:
        """`work` (tokenizing, templating an input of `size` characters) on the lane for its size.

        InputTooLong before queueing; TokenizerBusy when no thread took it within the queue
        limit (it never runs); TokenizeTimeout when it ran longer than `timeout_s` (the thread
        finishes on its own, the request has its answer)."""
        if size > self.max_input_chars:
            raise InputTooLong(f"{size} characters exceeds the router's limit of {self.max_input_chars}")
        job = _Job(work)
        future = asyncio.get_running_loop().run_in_executor(self._lane(size > self.large_input_chars), job)
        queued_until = time.monotonic() + self.queue_timeout_s
        try:
            while True:
                started = job.started_at
                until = queued_until if started is None else started + timeout_s
                left = until - time.monotonic()
                if left > 0:
                    done, _ = await asyncio.wait({future}, timeout=left)
                    if done:
                        return future.result()
                elif started is None and job.abandon_if_queued():
                    raise TokenizerBusy(self.queue_timeout_s)
                elif started is not None:
                    raise TokenizeTimeout(f"took longer than {timeout_s:g} s")
        except asyncio.CancelledError:
            job.abandon_if_queued()  # the client left: a queued job need not run
            raise

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
