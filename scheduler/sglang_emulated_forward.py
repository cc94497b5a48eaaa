"""Emulated GPU steps without the tiny model's layers: what runs on the CPU stays far inside the
paced step.

Under `--emulate-gpu` every forward pass is paced to the card's time, so the host's work only
has to finish inside it, and the tiny model's outputs are random anyway. Its full forward did
not always finish: SGLang's torch_native extend path pads each decode that rides in a mixed
batch to its whole KV length and runs quadratic attention, which dominated a mixed step's CPU
time and made emulated steps late (benchmarks/RESULTS.md, "Emulated batch shapes").

The stand-in replaces the model's `forward` on the loaded instance: the input tokens'
embeddings become the last hidden states, handed to the model's own logits processor, so
SGLang's pruning, logprobs and sampler take their usual paths for decode, extend and mixed
batches. A step then costs an embedding lookup plus one LM-head row per sampled token. Nothing
writes the KV cache and nothing reads it; SGLang's scheduler, memory pool, radix cache,
tokenizer and HTTP stay its own. No SGLang file is edited.

Each hidden row also gets a fixed vector of the token's position (the same table for every
model, scaled to the model's own embeddings), so the next token is a fixed function of the
previous token and its position: greedy outputs stay deterministic, and they do not fall into
the few short cycles a function of the previous token alone has. Under speculative decoding the
draft (the tiny target's perturbed copy) gets the stand-in too, and a draft token is accepted
where the two models' maps agree: about as often as a real draft model, at every position
alike, instead of per cycle.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("sglang_slo.emulated_forward")
POSITION_PERIOD = 4096  # distinct position vectors; positions beyond wrap around
POSITION_SEED = 1  # one table for every model: a draft and its target see the same vectors


class EmulatedForward:
    """Stands in for a causal LM's `forward(input_ids, positions, forward_batch, ...)`."""

    def __init__(self, model: Any, position_offset: int = 0) -> None:
        self.position_offset = position_offset  # added to the positions SGLang passes
        self.model_forward = model.forward  # the full model, for requests the stand-in cannot serve
        self.embed = model.get_input_embeddings()
        self.logits_processor = model.logits_processor
        self.lm_head = model.lm_head
        self._positions: Any = None  # built on first use, on the embeddings' device and dtype

    def position_rows(self, positions: Any) -> Any:
        """The fixed vectors of these positions, each as long as the mean embedding row."""
        import torch

        if self._positions is None:
            weight = self.embed.weight
            table = torch.randn(
                POSITION_PERIOD, weight.shape[1], generator=torch.Generator().manual_seed(POSITION_SEED)
            )
            table *= weight.detach().float().norm(dim=1).mean().cpu() / table.norm(dim=1, keepdim=True)
            self._positions = table.to(device=weight.device, dtype=weight.dtype)
        return self._positions[(positions + self.position_offset) % POSITION_PERIOD]

    def __call__(
        self,
        input_ids: Any,
        positions: Any,
        forward_batch: Any,
        input_embeds: Any = None,
        get_embedding: bool = False,
        **kwargs: Any,
    ) -> Any:
        if get_embedding:  # an embedding request wants the real pooled states
            return self.model_forward(
                input_ids, positions, forward_batch, input_embeds=input_embeds, get_embedding=True, **kwargs
            )
        import torch

        with torch.no_grad():
            hidden = input_embeds if input_embeds is not None else self.embed(input_ids)
            hidden = hidden + self.position_rows(positions)
            return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)


def unsupported_reason(model: Any) -> str | None:
    """Why the stand-in cannot replace this model's forward (None: it can)."""
    for name in ("logits_processor", "lm_head", "get_input_embeddings"):
        if not hasattr(model, name):
            return f"{type(model).__name__} has no {name}"
    if getattr(model, "capture_aux_hidden_states", False):
        return "the model captures auxiliary hidden states (an EAGLE3 target)"
    pp_group = getattr(model, "pp_group", None)
    if pp_group is not None and not (pp_group.is_first_rank and pp_group.is_last_rank):
        return "pipeline parallelism"
    return None


def is_installed(model: Any) -> bool:
    return isinstance(vars(model).get("forward"), EmulatedForward)


def install(model_runner: Any, position_offset: int = 0) -> bool:
    """Replace the loaded model's forward with the stand-in (idempotent); False, with a warning,
    when the model does not fit, and its full forward keeps running. `position_offset`: how far
    the positions SGLang passes this model lag the target's for the same token (a draft's)."""
    model = model_runner.model
    if is_installed(model):
        return True
    reason = unsupported_reason(model)
    if reason is not None:
        logger.warning("emulated steps run the full model: %s", reason)
        return False
    model.forward = EmulatedForward(model, position_offset)  # an instance attribute: shadows the class's method
    logger.info("emulated steps skip %s's layers (embeddings -> logits processor)", type(model).__name__)
    return True
