"""`--emulate-gpu GPU --emulate-model MODEL`: which profile paces the server, and the SGLang
flags that make the tiny CPU model behave like that card (its KV-cache capacity, context).

The pacing itself happens in the scheduler adapter (scheduler/core/pacing.py does the timing);
this module only turns the two flags into a profile and start-up flags, before SGLang parses.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from scheduler.core.perf_model import PROFILE_DIR, load_profile, profile_path

DEFAULT_MODEL = "llama3-8b"
CONTEXT_LEN = 8192  # Llama-3-8B's; the tiny model's 4096 positions are stretched to it
LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"


@dataclass(frozen=True)
class Emulation:
    name: str  # "h100/llama3-8b"
    profile: Path
    kv_token_capacity: int


def available() -> list[str]:
    """GPU/model pairs with a shipped profile."""
    return sorted(p.stem.replace("-", "/", 1) for p in PROFILE_DIR.glob("*.json"))


def resolve(gpu: str, model: str = DEFAULT_MODEL) -> Emulation:
    """A shipped GPU name (h100, a100, a40) or a path to a profile file of your own."""
    path = Path(gpu) if gpu.endswith(".json") else profile_path(gpu, model)
    if not path.is_file():
        raise ValueError(f"no profile for {gpu!r} with model {model!r} (have: {', '.join(available())})")
    profile = load_profile(path)
    if "table" not in profile:
        raise ValueError(f"{path}: pacing needs the profile's 'table' section")
    capacity = profile.get("kv_token_capacity")
    if not isinstance(capacity, int) or capacity <= 0:
        raise ValueError(f"{path}: needs a positive integer 'kv_token_capacity'")
    name = f"{profile.get('gpu', path.stem)}/{profile.get('model', model)}"
    return Emulation(name=name, profile=path, kv_token_capacity=capacity)


def startup_flags(emulation: Emulation, has_flag: Callable[..., bool], model: str = "tiny") -> list[str]:
    """SGLang flags the emulated card implies, for those the user did not set; `model` is the
    tiny model's alias (tiny-gpu on a GPU: a head size and dtype its attention backends take)."""
    extra: list[str] = []
    if not has_flag("--model-path", "--model"):
        extra += ["--model-path", model]
    if not has_flag("--max-total-tokens"):
        extra += ["--max-total-tokens", str(emulation.kv_token_capacity)]
    if not has_flag("--context-length"):
        extra += ["--context-length", str(CONTEXT_LEN)]
        os.environ.setdefault(LONGER_CONTEXT_ENV, "1")
    # The tiny model gains nothing from more threads, and several workers sharing a few cores
    # with spinning OpenMP pools slow each other down many times over, which breaks the pacing
    # (late steps; see the emulation section of benchmarks/RESULTS.md).
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return extra


def is_tiny_model(model_path: str | None) -> bool:
    """The tiny random model, by alias or by its prepared folder."""
    return model_path == "tiny" or _prepared(model_path, r"-\d+")


def _prepared(model_path: str | None, suffix: str) -> bool:
    """Whether the path is a folder server.models prepared: the tiny model's name + `suffix`."""
    if not model_path:
        return False
    from server.models import TINY_MODEL_NAME, cache_dir

    path = Path(model_path).resolve()
    in_cache = path.parent == (cache_dir() / "models").resolve()
    return in_cache and re.fullmatch(rf"{TINY_MODEL_NAME}{suffix}", path.name) is not None


def stand_in_applies(model_path: str | None, draft_path: str | None, full_forward: bool) -> bool:
    """Whether emulated steps skip the model's layers (scheduler/sglang_emulated_forward.py):
    for the tiny random model only (a real model's outputs matter), and not when the user asks
    for the tiny model's math (--emulate-full-forward: tokens that match a plain tiny server).
    Under speculative decoding the draft must be one of the tiny target's (tiny-draft for
    STANDALONE, tiny-eagle for EAGLE) or none (NGRAM): its passes then skip their layers too,
    and its proposals follow the stated acceptance model (--emulate-draft-acceptance). An EAGLE3
    target captures hidden states its stand-in has none of: both models keep their full forward."""
    if not is_tiny_model(model_path) or full_forward:
        return False
    return draft_path is None or is_tiny_draft(draft_path)


def is_tiny_draft(model_path: str | None) -> bool:
    """A draft of the tiny target the stand-in serves (tiny-draft, tiny-eagle), by alias or folder."""
    return model_path in ("tiny-draft", "tiny-eagle") or _prepared(model_path, r"-\d+-(draft[0-9.e+-]+|eagle)")
