"""Speculative decoding in the real engine on CPU (issue #9), with the SLO-adaptive length.

- STANDALONE (the tiny model's perturbed copy as draft: it agrees on about as many tokens as a
  real draft model) on an emulated H100, where both models run the emulated step's stand-in
  forward, returns exactly the stand-in target's tokens at temperature 0; EAGLE and EAGLE3 (tiny
  draft heads built offline, server/models.py) and NGRAM return exactly the plain server's.
- The SLO controller learns α from real verifies and picks the length from the running requests'
  TPOT tiers on an emulated H100: tight tiers (batch time binding) get drafts, loose tiers none.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import requests

from server.process import ServerProcess

PROMPTS = [[5 + (i * 7 + j * 31) % 500 for i in range(12 + 10 * j)] for j in range(4)]
SLOWDOWN = 8  # emulated H100 at x8: a plain decode step of 4 requests ~55 ms
TIGHT_TPOT_MS = 5 * SLOWDOWN  # tighter than that plain step: only drafting keeps it
LOOSE_TPOT_MS = 100 * SLOWDOWN


def _generate(url: str, ids: list[int], n: int, slo: dict | None = None) -> dict:
    body: dict = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
    if slo is not None:
        body["slo"] = slo
    r = requests.post(url + "/generate", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _speculation(server: ServerProcess) -> dict:
    """The scheduler's speculation status once it has counted a verify (it publishes its part
    periodically, so a snapshot taken right after the answers may predate them)."""
    status = server.status_when(lambda s: (s["engine"].get("speculation") or {}).get("verifies", 0) > 0, timeout=30)
    return status["engine"]["speculation"]


@pytest.fixture(scope="module")
def standalone() -> Iterator[ServerProcess]:
    with ServerProcess(
        "--model-path", "tiny", "--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
        "tiny-draft", "--slo-speculation", "--slo-spec-margin", "0.02", "--emulate-gpu", "h100",
        "--emulate-slowdown", str(SLOWDOWN), name="spec-standalone",
    ) as server:  # fmt: skip
        yield server


@pytest.fixture(scope="module")
def ngram() -> Iterator[ServerProcess]:
    with ServerProcess("--model-path", "tiny", "--speculative-algorithm", "NGRAM", name="spec-ngram") as server:
        yield server


EAGLE_DRAFTS = {"EAGLE": "tiny-eagle", "EAGLE3": "tiny-eagle3"}


@pytest.fixture(scope="module", params=sorted(EAGLE_DRAFTS))
def eagle(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    algorithm = request.param
    with ServerProcess(
        "--model-path", "tiny", "--speculative-algorithm", algorithm, "--speculative-draft-model-path",
        EAGLE_DRAFTS[algorithm], "--slo-speculation", "--slo-spec-steps", "1,2", name=f"spec-{algorithm.lower()}",
    ) as server:  # fmt: skip
        yield server


def _attention_backend(server: ServerProcess) -> str:
    """What SGLang resolved: on a CPU without AMX it silently falls back to torch_native, which has no
    tree mask or draft backend, unless our platform override keeps intel_amx (our pure-torch ops)."""
    r = requests.get(server.url + "/server_info", headers=server.headers, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["attention_backend"]


def _reference(tiny_server: ServerProcess) -> list[list[int]]:
    return [_generate(tiny_server.url, ids, 24)["output_ids"] for ids in PROMPTS]


def _stand_in_reference(prompt: list[int], n: int) -> list[int]:
    """The tiny target's greedy tokens under the emulated step's stand-in forward
    (scheduler/sglang_emulated_forward.py), computed here from its weights: the next token is
    the LM head's argmax of the last token's embedding plus its position's vector."""
    import torch
    from safetensors.torch import load_file

    from scheduler.sglang_emulated_forward import EmulatedForward
    from server.models import ensure_tiny_model

    weights = load_file(str(ensure_tiny_model() / "model.safetensors"))
    embed = torch.nn.Embedding.from_pretrained(weights["model.embed_tokens.weight"])
    head = weights["lm_head.weight"]
    model = SimpleNamespace(forward=None, get_input_embeddings=lambda: embed, logits_processor=None, lm_head=None)
    rows = EmulatedForward(model).position_rows  # type: ignore[arg-type]
    out, token = [], prompt[-1]
    for pos in range(len(prompt) - 1, len(prompt) - 1 + n):
        ids = torch.tensor([token])
        token = int((head @ (embed(ids) + rows(torch.tensor([pos])))[0]).argmax())
        out.append(token)
    return out


def test_standalone_returns_the_targets_tokens(standalone: ServerProcess) -> None:
    """Emulated, the target and the draft both run the stand-in forward (their layers skipped),
    the paced steps stay on the card's pace, and speculation still changes no token."""
    with ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrent: verify batches of several requests
        got = list(pool.map(lambda ids: _generate(standalone.url, ids, 24), PROMPTS))
    assert [g["output_ids"] for g in got] == [_stand_in_reference(ids, 24) for ids in PROMPTS]
    assert sum(g["meta_info"]["spec_num_correct_drafts"] for g in got) > 0  # drafts were accepted
    spec = _speculation(standalone)
    assert spec["algorithm"] == "STANDALONE" and spec["slo_adaptive"] is True
    assert spec["verifies"] > 0
    assert 0.2 < spec["alpha"] < 0.98  # a perturbed draft: real acceptance, not a self-draft's 1.0
    emulation = standalone.status_when(lambda s: s["engine"].get("emulation") is not None)["engine"]["emulation"]
    assert emulation["stand_in_forward"] is True
    assert spec["draft_cost_ratio"] == pytest.approx(0.1)  # the emulated card's draft, not the tiny copy
    assert _attention_backend(standalone) == "intel_amx"


def test_ngram_returns_the_plain_servers_tokens(ngram: ServerProcess, tiny_server: ServerProcess) -> None:
    reference = _reference(tiny_server)
    got = [_generate(ngram.url, ids, 24) for ids in PROMPTS]
    assert [g["output_ids"] for g in got] == reference
    spec = _speculation(ngram)
    assert spec["algorithm"] == "NGRAM" and spec["slo_adaptive"] is False
    assert sum(g["meta_info"]["spec_verify_ct"] for g in got) > 0  # drafts were verified
    assert _attention_backend(ngram) == "intel_amx"


def test_eagle_heads_return_the_plain_servers_tokens(eagle: ServerProcess, tiny_server: ServerProcess) -> None:
    reference = _reference(tiny_server)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        got = list(pool.map(lambda ids: _generate(eagle.url, ids, 24), PROMPTS))
    assert [g["output_ids"] for g in got] == reference
    assert sum(g["meta_info"]["spec_num_correct_drafts"] for g in got) > 0  # the heads predict some tokens
    spec = _speculation(eagle)
    assert spec["slo_adaptive"] is True and spec["verifies"] > 0 and spec["candidate_steps"] == [1, 2]


def _run_phase(server: ServerProcess, tpots_ms: list[float], tokens: int = 48) -> list[dict]:
    """Concurrent requests with the given TPOTs; the speculation status sampled while they run."""
    samples: list[dict] = []
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            samples.append(_speculation(server))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with ThreadPoolExecutor(len(tpots_ms)) as pool:
            slos = [{"ttft_ms": 60000, "tpot_ms": t} for t in tpots_ms]
            list(pool.map(lambda job: _generate(server.url, *job), [(p, tokens, s) for p, s in zip(PROMPTS, slos)]))
    finally:
        done.set()
        sampler.join()
    samples.append(_speculation(server))
    return samples


@pytest.mark.paced  # the length follows measured step times on an emulated card
def test_the_length_follows_the_tpot_mix(standalone: ServerProcess) -> None:
    tight = _run_phase(standalone, [TIGHT_TPOT_MS] * 4)[-1]
    loose = _run_phase(standalone, [LOOSE_TPOT_MS] * 4)[-1]
    for phase, tpot in ((tight, TIGHT_TPOT_MS), (loose, LOOSE_TPOT_MS)):
        assert [t["tpot_ms"] for t in phase["tiers"]] == [tpot] and phase["decisions"] > 0
    # α ≈ 0.8 and drafts at 0.1 of a target step: drafting shortens decode time per token, so
    # the tight tier, which a plain step cannot keep, is kept with drafts
    assert tight["steps"] >= 1 and tight["current"]["feasible"]
    assert tight["current"]["batch_time_ms"] == pytest.approx(TIGHT_TPOT_MS * tight["tokens_per_verify"], rel=0.02)
    # a plain step keeps the loose tier: drafting would only lengthen every step (and the
    # arrivals' TTFT), so the controller drafts nothing there
    assert loose["steps"] == 0, loose["current"]
    # both tiers at once: the paper's per-tier optimum drafts for the tight tier, which binds the
    # batch time, and fewer for the loose one, which keeps up with that time on fewer tokens
    mixed = _run_phase(standalone, [TIGHT_TPOT_MS, TIGHT_TPOT_MS, LOOSE_TPOT_MS, LOOSE_TPOT_MS])
    per_tier = [s["per_tier_optimum"] for s in mixed if s["per_tier_optimum"] and len(s["tiers"]) == 2]
    assert per_tier, "the two tiers were never seen together"
    lengths = per_tier[-1]["lengths"]
    tight_len, loose_len = (lengths[k] for k in sorted(lengths, key=float))
    assert tight_len > loose_len
    engine = [s for s in mixed if len(s["tiers"]) == 2][-1]
    assert engine["steps"] >= 1  # one length for the whole batch, and it drafts for the tight tier


@pytest.mark.paced  # shares the paced test's server
def test_speculation_metrics_are_exported(standalone: ServerProcess) -> None:
    text = requests.get(standalone.url + "/metrics", timeout=10).text
    for name in (
        'sglang_slo_spec_steps{algorithm="STANDALONE"}',
        "sglang_slo_spec_alpha",
        "sglang_slo_spec_tokens_per_verify",
        "sglang_slo_spec_verifies_total",
    ):
        assert name in text, name
