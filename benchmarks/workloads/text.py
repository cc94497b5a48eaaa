"""Real prompt text of an exact token length, for replaying traces that only give lengths.

Random token ids would make every prompt out-of-distribution noise (odd attention patterns,
degenerate outputs); real prose behaves like a real prompt. The corpus is the Python language
reference shipped with every CPython (``pydoc_data.topics``), so nothing is downloaded and every
machine builds the same prompts for the same seed.

Prompts are token-id lists so their length is exact; ``decode`` gives text for callers that must
send a string (re-tokenising it can shift the length by a few tokens at the joins).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from tokenizers import Tokenizer

from benchmarks.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest


def corpus_text() -> str:
    """The language reference, topics in sorted key order so the text never depends on dict order."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


@lru_cache(maxsize=8)
def _corpus_ids(tokenizer_file: str) -> tuple[int, ...]:
    """Tokenised once per tokenizer per process: it takes about a second for 0.5 MB of text."""
    tokenizer = Tokenizer.from_file(tokenizer_file)
    return tuple(tokenizer.encode(corpus_text(), add_special_tokens=False).ids)


class PromptText:
    """Windows of the tokenised corpus: random ones, Mooncake prefix blocks, and agent contexts."""

    def __init__(self, tokenizer_dir: str | Path) -> None:
        path = Path(tokenizer_dir)
        self.tokenizer_file = path if path.is_file() else path / "tokenizer.json"
        self.tokenizer = Tokenizer.from_file(str(self.tokenizer_file))
        self.corpus = _corpus_ids(str(self.tokenizer_file.resolve()))
        if not self.corpus:
            raise ValueError(f"{self.tokenizer_file}: the corpus tokenised to nothing")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def window(self, start: int, n: int) -> list[int]:
        """n consecutive corpus ids from ``start``, wrapping round the corpus as often as needed."""
        if n < 0:
            raise ValueError(f"token count must be >= 0, got {n}")
        size = len(self.corpus)
        start %= size
        out = list(self.corpus[start : start + n])
        while len(out) < n:
            out.extend(self.corpus[: n - len(out)])
        return out

    def ids(self, n: int, rng: random.Random) -> list[int]:
        """A window of n ids at a random place: unrelated prompts share no prefix."""
        return self.window(rng.randrange(len(self.corpus)), n)

    def block(self, hash_id: int, block_tokens: int) -> list[int]:
        """One Mooncake block: seeded by the hash id alone, so it is the same in every request and run."""
        return self.window(random.Random(hash_id).randrange(len(self.corpus)), block_tokens)

    def for_hash_ids(self, hash_ids: Sequence[int], prompt_tokens: int, block_tokens: int) -> list[int]:
        """Blocks of ``hash_ids`` in order, cut or padded to exactly ``prompt_tokens``.

        Two requests that share a leading run of hash ids share exactly those blocks as a prompt
        prefix, which is what makes a prefix cache hit where the trace says it did. Padding (a
        prompt longer than its blocks) continues the corpus after the last block.
        """
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        if prompt_tokens < 0:
            raise ValueError(f"prompt_tokens must be >= 0, got {prompt_tokens}")
        out: list[int] = []
        end = 0  # corpus position after the last block: where padding continues
        for hash_id in hash_ids:
            if len(out) >= prompt_tokens:
                break
            start = random.Random(hash_id).randrange(len(self.corpus))
            out.extend(self.window(start, min(block_tokens, prompt_tokens - len(out))))
            end = start + block_tokens
        if len(out) < prompt_tokens:
            out.extend(self.window(end, prompt_tokens - len(out)))
        return out

    def for_program(self, program_id: str, prompt_tokens: int) -> list[int]:
        """The leading ``prompt_tokens`` of a context stream seeded by the program id.

        Agent calls re-send their previous context, so call k shares its leading
        min(len_k, len_k-1) tokens with call k-1, as a growing context does. The previous call's
        output is not in the stream, so when a trace's context shrinks (``prefix_tokens`` below the
        previous prompt) this shares more than the trace did.
        """
        return self.window(random.Random(program_id).randrange(len(self.corpus)), prompt_tokens)

    def build(
        self,
        req: TraceRequest,
        rng: random.Random,
        length_scale: float = 1.0,
        max_prompt: int | None = None,
        block_tokens: int | None = None,
    ) -> list[int]:
        """The prompt for one trace request, its length scaled (at least 1 token) and capped.

        Mooncake hash ids win (the block size is scaled by the same factor, so shared prefixes
        keep the same share of the prompt; ``block_tokens`` overrides it for requests whose
        lengths were scaled earlier); then a program's root call and its calls that reuse a
        prefix (agent rounds) get the program's context stream, so round k extends what earlier
        rounds sent; anything else (e.g. a deep-research call with no reuse) gets a random window.
        """
        if not length_scale > 0:
            raise ValueError(f"length_scale must be > 0, got {length_scale}")
        n = max(1, round(req.prompt_tokens * length_scale))
        if max_prompt is not None:
            n = min(n, max(1, max_prompt))
        if req.prefix_hash_ids:
            block = block_tokens or max(1, round(MOONCAKE_BLOCK_TOKENS * length_scale))
            return self.for_hash_ids(req.prefix_hash_ids, n, block)
        if req.program_id is not None and (req.prefix_tokens > 0 or not req.parents):
            return self.for_program(req.program_id, n)
        return self.ids(n, rng)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)
