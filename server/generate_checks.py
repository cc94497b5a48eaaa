"""Checks of a generate request that SGLang makes too late or not at all, each a 400 naming the
field (a ValueError "field: ..." that SGLang's routes answer as a 400).

Each guards a value SGLang would carry to a crash: an id outside the vocabulary takes the
scheduler down in the embedding lookup, a list `rid` for one prompt is unhashable in the request
table, a list where one prompt takes one value ends the scheduler's request check, and a
per-prompt list shorter than the batch is indexed past its end when the batch is split.
They run on SGLang's GenerateReqInput, read by attribute only.
"""

from __future__ import annotations

from typing import Any

# The fields SGLang's GenerateReqInput.__getitem__ indexes per prompt when they are lists, after
# normalisation has expanded the batch by `n`; some of them normalisation never checks.
PER_PROMPT_LISTS = (
    "text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data", "mm_hashes",
    "mm_content_hashes", "sampling_params", "watermark", "return_logprob", "logprob_start_len",
    "top_logprobs_num", "token_ids_logprob", "return_sampling_mask", "sampling_logprobs_mode",
    "return_hidden_states", "lora_path", "lora_id", "custom_logit_processor", "bootstrap_host",
    "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "extra_key",
    "cache_salt", "kv_hints", "multi_item_delimiter_indices", "token_indices_to_pool",
)  # fmt: skip
# Of those, the ones a single prompt's request takes as one value.
ONE_VALUE_PER_PROMPT = (
    "watermark", "return_logprob", "logprob_start_len", "top_logprobs_num", "return_sampling_mask",
    "sampling_logprobs_mode", "return_hidden_states", "lora_path", "lora_id", "custom_logit_processor",
    "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key", "decode_tp_size", "extra_key",
    "cache_salt", "kv_hints",
)  # fmt: skip


def check_token_ids(input_ids: Any, vocab_size: int) -> None:
    """SGLang would pass an id outside the vocabulary to the model, whose embedding lookup then
    takes the whole scheduler down."""
    if not input_ids:
        return
    rows = input_ids if isinstance(input_ids[0], list) else [input_ids]
    for row in rows:
        bad = next((t for t in row if not isinstance(t, int) or not 0 <= t < vocab_size), None)
        if bad is not None:
            raise ValueError(f"input_ids: token id {bad!r} is outside the model's vocabulary [0, {vocab_size})")


def check_rid(obj: Any) -> None:
    """SGLang keys its request table by `rid` before it checks the field: a list (or a list of
    lists) for one prompt is unhashable there and the request ends in a 500."""
    rid = getattr(obj, "rid", None)
    if rid is None or isinstance(rid, str):
        return
    text, ids = getattr(obj, "text", None), getattr(obj, "input_ids", None)
    single = isinstance(text, str) or (isinstance(ids, list) and bool(ids) and isinstance(ids[0], int))
    if isinstance(rid, list) and not single and all(isinstance(r, str) for r in rid):
        return
    raise ValueError("rid: must be a string (a list of strings, one per prompt, for a batch)")


def check_per_prompt_fields(obj: Any) -> None:
    """On a normalised request: one prompt's fields hold one value each, not a list (SGLang's
    scheduler checks some of them again and ends on a list); a batch's lists (its `rid` one per
    request, `n` copies included) hold an entry for each request, or splitting the batch would
    index past their end."""
    if getattr(obj, "is_single", True):
        listed = next((name for name in ONE_VALUE_PER_PROMPT if isinstance(getattr(obj, name, None), list)), None)
        if listed is not None:
            raise ValueError(f"{listed}: must be a single value for one prompt (a list is one value per prompt)")
        return
    if not isinstance(getattr(obj, "rid", None), list):
        return
    requests = len(obj.rid)
    prompts = getattr(obj, "batch_size", requests)
    for name in PER_PROMPT_LISTS:
        value = getattr(obj, name, None)
        if isinstance(value, list) and len(value) < requests:
            raise ValueError(f"{name}: has {len(value)} entries for a batch of {prompts} prompts; send one per prompt")
    modalities = getattr(obj, "modalities", None)
    if isinstance(modalities, list) and modalities and len(modalities) < requests:
        raise ValueError(f"modalities: has {len(modalities)} entries for a batch of {prompts} prompts")
