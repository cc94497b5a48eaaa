"""benchmarks.workloads.text: exact-length prompts of real prose, with Mooncake prefixes shared exactly."""

from __future__ import annotations

import random

import pytest

from benchmarks.workloads.text import PromptText, corpus_text
from benchmarks.workloads.traces import MOONCAKE_BLOCK_TOKENS, TraceRequest
from server.models import ensure_tiny_model


@pytest.fixture(scope="module")
def text() -> PromptText:
    return PromptText(ensure_tiny_model())


def _req(**kw: object) -> TraceRequest:
    base: dict[str, object] = {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 10, "rid": "r"}
    return TraceRequest(**{**base, **kw})  # type: ignore[arg-type]


def test_corpus_is_stable_prose() -> None:
    assert corpus_text() == corpus_text()
    assert len(corpus_text()) > 100_000


@pytest.mark.parametrize("n", [0, 1, 7, 512, 3000])
def test_ids_exact_length_and_in_vocab(text: PromptText, n: int) -> None:
    ids = text.ids(n, random.Random(n))
    assert len(ids) == n
    assert all(0 <= i < text.vocab_size for i in ids)


def test_ids_longer_than_corpus_wrap(text: PromptText) -> None:
    n = len(text.corpus) * 2 + 17
    ids = text.ids(n, random.Random(0))
    assert len(ids) == n
    assert ids[: len(text.corpus)] == ids[len(text.corpus) : 2 * len(text.corpus)]


def test_ids_deterministic_for_a_seed(text: PromptText) -> None:
    assert text.ids(200, random.Random(3)) == text.ids(200, random.Random(3))
    assert text.ids(200, random.Random(3)) != text.ids(200, random.Random(4))


def test_negative_length_rejected(text: PromptText) -> None:
    with pytest.raises(ValueError):
        text.ids(-1, random.Random(0))


def test_decode_is_readable_english(text: PromptText) -> None:
    words = set(text.decode(text.ids(400, random.Random(1))).lower().split())
    assert words & {"the", "a", "is", "of", "to", "and", "in"}


@pytest.mark.parametrize("prompt_tokens", [1, 30, 64, 100, 250])
def test_hash_ids_exact_length(text: PromptText, prompt_tokens: int) -> None:
    ids = text.for_hash_ids((1, 2, 3), prompt_tokens, block_tokens=64)
    assert len(ids) == prompt_tokens
    assert all(0 <= i < text.vocab_size for i in ids)


def test_shared_hash_prefix_shares_exactly_its_blocks(text: PromptText) -> None:
    a = text.for_hash_ids((10, 11, 12, 13), 250, block_tokens=64)
    b = text.for_hash_ids((10, 11, 99, 98), 256, block_tokens=64)
    assert a[:128] == b[:128]
    assert a[128:192] != b[128:192]


def test_blocks_independent_of_call_order_and_position(text: PromptText) -> None:
    later = text.for_hash_ids((5, 6, 7), 192, block_tokens=64)
    fresh = PromptText(ensure_tiny_model())
    assert fresh.for_hash_ids((7,), 64, block_tokens=64) == later[128:]
    assert text.block(6, 64) == later[64:128]


def test_different_hash_ids_give_different_blocks(text: PromptText) -> None:
    blocks = [tuple(text.block(h, 32)) for h in range(20)]
    assert len(set(blocks)) == len(blocks)


def test_padding_past_the_blocks(text: PromptText) -> None:
    ids = text.for_hash_ids((1,), 100, block_tokens=40)
    assert len(ids) == 100
    assert ids[:40] == text.block(1, 40)


def test_build_scales_lengths_and_blocks(text: PromptText) -> None:
    a = _req(prompt_tokens=2 * MOONCAKE_BLOCK_TOKENS, prefix_hash_ids=(1, 2))
    b = _req(prompt_tokens=2 * MOONCAKE_BLOCK_TOKENS, prefix_hash_ids=(1, 3))
    pa = text.build(a, random.Random(0), length_scale=0.125)
    pb = text.build(b, random.Random(9), length_scale=0.125)
    assert len(pa) == len(pb) == 128
    assert pa[:64] == pb[:64] and pa[64:] != pb[64:]


def test_build_caps_and_keeps_at_least_one_token(text: PromptText) -> None:
    assert len(text.build(_req(prompt_tokens=5000), random.Random(0), max_prompt=300)) == 300
    assert len(text.build(_req(prompt_tokens=1), random.Random(0), length_scale=0.01)) == 1
    assert text.build(_req(), random.Random(2)) == text.build(_req(), random.Random(2))


def test_build_agent_calls_share_their_context(text: PromptText) -> None:
    first = _req(prompt_tokens=300, program_id="p", stage=0, rid="p#0")
    second = _req(prompt_tokens=500, program_id="p", stage=1, parents=("p#0",), prefix_tokens=350, rid="p#1")
    other = _req(prompt_tokens=500, program_id="q", stage=1, parents=("q#0",), prefix_tokens=350, rid="q#1")
    p1 = text.build(first, random.Random(0))
    p2 = text.build(second, random.Random(1))
    assert len(p2) == 500
    assert p2[:300] == p1  # round 1 re-sends round 0's context
    assert text.build(second, random.Random(7)) == p2
    assert p2[:300] != text.build(other, random.Random(1))[:300]


def test_build_call_without_reuse_is_a_random_window(text: PromptText) -> None:
    call = _req(prompt_tokens=200, program_id="dr1", stage=2, parents=("dr1.s1.c0",), rid="dr1.s2.c0")
    assert text.build(call, random.Random(0)) == text.ids(200, random.Random(0))
