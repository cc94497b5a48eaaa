"""The tiny EAGLE / EAGLE3 draft heads: config fields and tensor names/shapes are what SGLang
0.5.17's loaders expect for the tiny Llama target (hidden 64, 4 heads × 16, 2 KV heads, MLP 128,
vocab 512). Built offline from the cached tiny target in a few seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from server import models

H, Q, KV, MLP, VOCAB = 64, 64, 32, 128, 512

# sglang/srt/models/llama_eagle.py, LlamaForCausalLMEagle.load_weights: every name but lm_head.*
# gets a "model." prefix and goes to LlamaForCausalLM's loader (q/k/v -> qkv_proj, gate/up ->
# gate_up_proj). Its LlamaModel has embed_tokens, fc = Linear(2H, H) with bias, one decoder layer
# whose input_layernorm is deleted (layer 0), no final norm. Embedding and LM head are replaced by
# the target's (speculative/eagle_worker_v2.py, init_lm_head -> set_embed_and_head).
EAGLE_TENSORS = {
    "embed_tokens.weight": (VOCAB, H),
    "fc.weight": (H, 2 * H),
    "fc.bias": (H,),
    "layers.0.self_attn.q_proj.weight": (Q, H),
    "layers.0.self_attn.k_proj.weight": (KV, H),
    "layers.0.self_attn.v_proj.weight": (KV, H),
    "layers.0.self_attn.o_proj.weight": (H, Q),
    "layers.0.post_attention_layernorm.weight": (H,),
    "layers.0.mlp.gate_proj.weight": (MLP, H),
    "layers.0.mlp.up_proj.weight": (MLP, H),
    "layers.0.mlp.down_proj.weight": (H, MLP),
}
# sglang/srt/models/llama_eagle3.py, LlamaForCausalLMEagle3.load_weights: "midlayer" -> "layers.0",
# names not found at top level get "model."; `d2t` becomes hot_token_id = d2t + arange, `t2d` is
# skipped. Its decoder layer's q/k/v read cat(embeds, hidden) (2H) and it has hidden_norm; fc is
# Linear(target_hidden_size · num_aux, H) without bias; lm_head has draft_vocab_size rows. The
# embedding is the target's (eagle_worker_v2.py, init_lm_head -> set_embed).
DRAFT_VOCAB = models.TINY_EAGLE3_DRAFT_VOCAB
EAGLE3_TENSORS = {
    "fc.weight": (H, H * len(models.TINY_EAGLE3_AUX_LAYERS)),
    "midlayer.hidden_norm.weight": (H,),
    "midlayer.input_layernorm.weight": (H,),
    "midlayer.post_attention_layernorm.weight": (H,),
    "midlayer.self_attn.q_proj.weight": (Q, 2 * H),
    "midlayer.self_attn.k_proj.weight": (KV, 2 * H),
    "midlayer.self_attn.v_proj.weight": (KV, 2 * H),
    "midlayer.self_attn.o_proj.weight": (H, Q),
    "midlayer.mlp.gate_proj.weight": (MLP, H),
    "midlayer.mlp.up_proj.weight": (MLP, H),
    "midlayer.mlp.down_proj.weight": (H, MLP),
    "norm.weight": (H,),
    "lm_head.weight": (DRAFT_VOCAB, H),
    "d2t": (DRAFT_VOCAB,),
    "t2d": (VOCAB,),
}


@pytest.fixture(scope="module")
def drafts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Both heads built fresh in a temporary cache that links the (cached) tiny target."""
    target = models.ensure_tiny_model()
    cache = tmp_path_factory.mktemp("cache")
    (cache / "models").mkdir()
    (cache / "models" / target.name).symlink_to(target, target_is_directory=True)
    mp = pytest.MonkeyPatch()
    mp.setattr(models, "cache_dir", lambda: cache)
    try:
        yield {"eagle": models.ensure_tiny_eagle_model(), "eagle3": models.ensure_tiny_eagle3_model()}
    finally:
        mp.undo()


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def _config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def test_eagle_head_matches_sglang_layout(drafts: dict[str, Path]) -> None:
    path = drafts["eagle"]
    assert (path / models.READY_MARKER).exists() and (path / "tokenizer.json").exists()
    config = _config(path)
    assert config["architectures"] == ["LlamaForCausalLMEagle"]
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == H and config["vocab_size"] == VOCAB
    assert config["tie_word_embeddings"] is False
    tensors = _tensors(path)
    assert {name: tuple(t.shape) for name, t in tensors.items()} == EAGLE_TENSORS
    assert not any(name.startswith("model.") or "lm_head" in name for name in tensors)


def test_eagle3_head_matches_sglang_layout(drafts: dict[str, Path]) -> None:
    import torch

    path = drafts["eagle3"]
    assert (path / models.READY_MARKER).exists() and (path / "tokenizer.json").exists()
    config = _config(path)
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["num_hidden_layers"] == 1 and config["hidden_size"] == H and config["vocab_size"] == VOCAB
    assert config["draft_vocab_size"] == DRAFT_VOCAB and config["target_hidden_size"] == H
    assert config["tie_word_embeddings"] is False  # else the draft would have no lm_head of its own
    # The target's layers_to_capture are id + 1 (models/llama.py, set_eagle3_layers_to_capture):
    # only id 0 is captured by a 2-layer target, and the draft's num_aux must equal that count.
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0]
    tensors = _tensors(path)
    assert {name: tuple(t.shape) for name, t in tensors.items()} == EAGLE3_TENSORS
    hot = tensors["d2t"] + torch.arange(DRAFT_VOCAB)  # what the loader turns d2t into
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert hot.unique().numel() == DRAFT_VOCAB and 0 <= int(hot.min()) and int(hot.max()) < VOCAB
    assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), hot)


def test_heads_are_deterministic(drafts: dict[str, Path], tmp_path: Path) -> None:
    import torch

    for name, build in (("eagle", models._build_tiny_eagle), ("eagle3", models._build_tiny_eagle3)):
        out = tmp_path / name
        out.mkdir()
        build(out, 0)
        again, first = _tensors(out), _tensors(drafts[name])
        assert again.keys() == first.keys()
        assert all(torch.equal(again[k], first[k]) for k in first), name


def test_launcher_aliases() -> None:
    from launch_argv import MODEL_ALIASES

    assert {"tiny-eagle", "tiny-eagle3"} <= set(MODEL_ALIASES)
