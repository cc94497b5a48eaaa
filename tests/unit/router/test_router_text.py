"""The router's text side: incremental detokenization equals a full decode, stop trimming,
the chat-template fallback, and prefix block hashes."""

from __future__ import annotations

import random
from typing import Any

import pytest

from router.prefix import prefix_hashes
from router.tokenizer import IncrementalDetokenizer, RouterTokenizer, TokenizerUnavailable, render_chat_fallback
from tests.unit.router._router_harness import run, tiny_hf, tiny_path


def _tokenizer() -> RouterTokenizer:
    return RouterTokenizer(tiny_path(), tokenizer=tiny_hf())


def _incremental(tok: RouterTokenizer, ids: list[int], rng: random.Random, **kw: Any) -> str:
    detok = tok.detokenizer(**kw)
    out, pos = "", 0
    while pos < len(ids):
        step = rng.randint(1, 4)
        out += detok.push(ids[pos : pos + step])
        pos += step
    out += detok.finish()
    assert out == detok.text
    return out


@pytest.mark.parametrize("seed", range(6))
def test_incremental_detokenizer_equals_full_decode_on_random_ids(seed: int) -> None:
    tok = _tokenizer()
    rng = random.Random(seed)
    vocab = len(tiny_hf())
    for _ in range(30):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        assert _incremental(tok, ids, rng) == tok.decode(ids)
        kept = _incremental(tok, ids, rng, skip_special_tokens=False)
        assert kept == tok.decode(ids, skip_special_tokens=False)


def test_split_characters_are_held_back_not_garbled() -> None:
    tok = _tokenizer()
    ids = tiny_hf().encode("日本語", add_special_tokens=False)
    assert len(ids) > 3  # the byte-level tokens split the characters
    detok = tok.detokenizer()
    deltas = [detok.push([t]) for t in ids]
    assert all("\ufffd" not in d for d in deltas) and "".join(deltas) + detok.finish() == "日本語"


def test_prompt_context_is_decoded_but_never_emitted() -> None:
    tok = _tokenizer()
    prompt = tiny_hf().encode("Hello", add_special_tokens=False)
    out = tiny_hf().encode(" world", add_special_tokens=False)
    detok = tok.detokenizer(prompt)
    assert detok.push(out) + detok.finish() == " world"


def test_finish_trims_a_stop_string_only_where_not_yet_emitted() -> None:
    tok = _tokenizer()
    ids = tiny_hf().encode("one two three", add_special_tokens=False)
    detok = tok.detokenizer()
    assert detok.finish(ids, matched_stop=" two") == "one" and detok.text == "one"
    detok = tok.detokenizer()
    assert detok.finish(ids, matched_stop=" two", no_stop_trim=True) == "one two"
    streamed = tok.detokenizer()
    emitted = streamed.push(ids)
    assert streamed.finish(matched_stop=" two") == "" and streamed.text == emitted  # no taking back


def test_decode_calls_see_a_small_window_not_the_whole_output() -> None:
    calls: list[int] = []

    def decode(ids: list[int]) -> str:
        calls.append(len(ids))
        return "".join(chr(97 + i % 26) for i in ids)

    detok = IncrementalDetokenizer(decode)
    for i in range(200):
        detok.push([i])
    assert max(calls) <= 2 and len(detok.text) == 200


class _NoTemplate:
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


def test_chat_without_a_template_falls_back_to_role_lines() -> None:
    tok = RouterTokenizer("x", tokenizer=_NoTemplate())
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_chat_fallback(messages) == "system: Be brief.\nuser: Hi\nassistant:"
    assert tok.chat_ids(messages) == [ord(c) for c in render_chat_fallback(messages)]
    assert _tokenizer().has_chat_template  # the tiny model has one: the template path is the tested one


def test_a_tokenizer_without_a_path_or_a_bad_path_is_unavailable() -> None:
    async def go() -> None:
        with pytest.raises(TokenizerUnavailable):
            await RouterTokenizer().ensure(None)

        def broken(path: str) -> Any:
            raise OSError("no such folder")

        tok = RouterTokenizer(loader=broken)
        with pytest.raises(TokenizerUnavailable, match="no such folder"):
            await tok.ensure("/nonexistent")
        assert tok.error is not None and not tok.loaded
        loaded = RouterTokenizer(loader=lambda path: _NoTemplate())
        await loaded.ensure("/models/x")
        assert loaded.loaded and loaded.path == "/models/x" and loaded.error is None

    run(go)


def test_prefix_hashes_are_equal_for_shared_prefixes() -> None:
    rng = random.Random(1)
    shared = [rng.randrange(50_000) for _ in range(64 * 3)]
    a = shared + [rng.randrange(50_000) for _ in range(100)]
    b = shared + [rng.randrange(50_000) for _ in range(100)]
    ha, hb = prefix_hashes(a), prefix_hashes(b)
    assert len(ha) == len(hb) == (64 * 3 + 100) // 64 == 4
    assert ha[:3] == hb[:3] and ha[3] != hb[3]
    assert prefix_hashes(a) == ha and all(0 <= h < 2**63 for h in ha)  # deterministic, fit an int64
    assert prefix_hashes(a[:63]) == ()  # a partial block says nothing
    assert prefix_hashes(a[:64]) == ha[:1]
    diverge = [a[0] + 1, *a[1:]]
    assert not set(prefix_hashes(diverge)) & set(ha)  # chained: an early difference changes every hash
    assert prefix_hashes(a, block_tokens=16)[:4] != ha and len(prefix_hashes(a, block_tokens=16)) == 18
    assert len(prefix_hashes(a, max_blocks=2)) == 2
