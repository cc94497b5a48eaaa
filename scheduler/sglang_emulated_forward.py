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
the few short cycles a function of the previous token alone has.

Under speculative decoding the draft gets a stand-in too (`EmulatedDraft`): the target's map,
except on the (token, position) cells a fixed draw rejects, where the draft proposes another
token. Each drafted token is then accepted with a stated probability, at every position and for
every request alike: an acceptance model, since the tiny models' agreement says nothing about a
real draft's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("sglang_slo.emulated_forward")
POSITION_PERIOD = 4096  # distinct position vectors; positions beyond wrap around
POSITION_SEED = 1  # one table for every model: a draft and its target see the same vectors
DRAW_CELLS = 1 << 14  # (token, position) cells of a draft's acceptance draw; collisions are harmless
DRAW_SEED = 2
AWAY_SCALE = 4.0  # a rejected cell's push, in mean embedding lengths: enough to move the argmax


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
            hidden = self.hidden_rows(input_ids, positions, input_embeds)
            return self.logits_processor(input_ids, hidden, self.lm_head, forward_batch)

    def hidden_rows(self, input_ids: Any, positions: Any, input_embeds: Any = None) -> Any:
        """The last hidden state of each input token: its embedding plus its position's vector."""
        hidden = input_embeds if input_embeds is not None else self.embed(input_ids)
        return hidden + self.position_rows(positions)


class EmulatedDraft(EmulatedForward):
    """A draft's stand-in: the target's embedding, LM head and position vectors, so it proposes
    the target's next token, except on the (token, position) cells whose fixed uniform draw is
    at least `acceptance`, where a fixed direction several embeddings long moves the argmax to
    another token. The target's verify accepts a drafted token with probability `acceptance`."""

    def __init__(self, model: Any, target: EmulatedForward, acceptance: float, position_offset: int = 0) -> None:
        super().__init__(model, position_offset)
        self.embed, self.lm_head = target.embed, target.lm_head
        self.acceptance = acceptance
        self._draws: tuple[Any, Any] | None = None  # (uniform per cell, push per cell), built on first use

    def hidden_rows(self, input_ids: Any, positions: Any, input_embeds: Any = None) -> Any:
        hidden = super().hidden_rows(input_ids, positions, input_embeds)
        uniform, away = self._cells(hidden)
        cell = (input_ids.long() * 1_000_003 + positions + self.position_offset) % DRAW_CELLS
        rejected = (uniform[cell] >= self.acceptance).unsqueeze(-1)
        return hidden + rejected * away[cell]

    def _cells(self, like: Any) -> tuple[Any, Any]:
        if self._draws is None:
            import torch

            gen = torch.Generator().manual_seed(DRAW_SEED)
            uniform = torch.rand(DRAW_CELLS, generator=gen)
            away = torch.randn(DRAW_CELLS, like.shape[-1], generator=gen)
            length = self.embed.weight.detach().float().norm(dim=1).mean().cpu()
            away *= AWAY_SCALE * length / away.norm(dim=1, keepdim=True)
            self._draws = (uniform.to(like.device), away.to(device=like.device, dtype=like.dtype))
        return self._draws


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


def install(model_runner: Any) -> bool:
    """Replace the loaded target model's forward with the stand-in (idempotent); False, with a
    warning, when the model does not fit, and its full forward keeps running."""
    return _install(model_runner, EmulatedForward)


def install_draft(draft_runner: Any, target_runner: Any, acceptance: float, position_offset: int = 0) -> bool:
    """The draft's stand-in (`EmulatedDraft`) over the target's, which must be installed first;
    False, the draft's full forward kept, when either does not fit. `position_offset`: how far
    the positions SGLang passes the draft lag the target's for the same token."""
    target = vars(target_runner.model).get("forward")
    if not isinstance(target, EmulatedForward):
        logger.warning("the draft runs its full forward: the target's stand-in is not installed")
        return False
    return _install(draft_runner, lambda model: EmulatedDraft(model, target, acceptance, position_offset))


def _install(model_runner: Any, stand_in: Callable[[Any], EmulatedForward]) -> bool:
    model = model_runner.model
    if is_installed(model):
        return True
    reason = unsupported_reason(model)
    if reason is not None:
        logger.warning("emulated steps run the full model: %s", reason)
        return False
    model.forward = stand_in(model)  # an instance attribute: shadows the class's method
    logger.info("emulated steps skip %s's layers (embeddings -> logits processor)", type(model).__name__)
    return True
