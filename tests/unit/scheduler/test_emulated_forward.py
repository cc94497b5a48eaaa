"""The emulated step's stand-in forward: SGLang's own logits processor gets one hidden row per
input token, so decode, extend and mixed batches (and input logprobs) come out in the shapes the
sampler expects, and the model's layers never run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from server.cpu_support import activate  # noqa: E402

activate()  # the CPU import hooks SGLang's modules need on this machine

from sglang.srt.layers import logits_processor as sglang_logits  # noqa: E402
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402

from scheduler.sglang_emulated_forward import EmulatedForward, install, install_draft, is_installed  # noqa: E402

VOCAB, HIDDEN = 512, 64


@pytest.fixture(autouse=True, scope="module")
def single_process_context() -> None:
    """The runtime context a one-process, no-DP SGLang scheduler publishes (the processor reads it)."""
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path="dummy"), role="scheduler", ranks=SpawnRanks(world_rank=0))


class TinyCausalLm(torch.nn.Module):
    """The parts of an SGLang causal LM the stand-in uses; its layers count their calls."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.embed_tokens = torch.nn.Embedding(VOCAB, HIDDEN)
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.logits_processor = sglang_logits.LogitsProcessor(SimpleNamespace(vocab_size=VOCAB, hidden_size=HIDDEN))
        self.layer_calls = 0

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self.embed_tokens

    def forward(self, input_ids, positions, forward_batch, input_embeds=None, get_embedding=False):  # noqa: ANN001
        self.layer_calls += 1
        return "full model"


def _runner() -> SimpleNamespace:
    model = TinyCausalLm()
    assert install(SimpleNamespace(model=model))
    return SimpleNamespace(model=model)


def _extend(mode: ForwardMode, lens: list[int], **logprobs: object) -> sglang_logits.LogitsMetadata:
    return sglang_logits.LogitsMetadata(
        forward_mode=mode, extend_seq_lens=torch.tensor(lens), extend_seq_lens_cpu=lens, **logprobs
    )


def _decode() -> sglang_logits.LogitsMetadata:
    return sglang_logits.LogitsMetadata(forward_mode=ForwardMode.DECODE)


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def test_a_decode_batch_gets_one_logit_row_per_request_without_running_the_layers() -> None:
    runner = _runner()
    out = runner.model.forward(_ids(5), torch.arange(5), sglang_logits.LogitsMetadata(forward_mode=ForwardMode.DECODE))
    assert out.next_token_logits.shape == (5, VOCAB)
    assert runner.model.layer_calls == 0


def test_extend_and_mixed_batches_get_one_row_per_request() -> None:
    runner = _runner()
    prefill = runner.model.forward(_ids(10), torch.arange(10), _extend(ForwardMode.EXTEND, [4, 1, 5]))
    assert prefill.next_token_logits.shape == (3, VOCAB)
    # a mixed step: an 8k-token chunk next to 256 decodes riding along (one token each)
    lens = [8192] + [1] * 256
    mixed = runner.model(_ids(sum(lens)), torch.arange(sum(lens)), _extend(ForwardMode.MIXED, lens))
    assert mixed.next_token_logits.shape == (257, VOCAB)
    assert runner.model.layer_calls == 0


def test_input_logprobs_take_sglangs_own_path() -> None:
    runner = _runner()
    metadata = _extend(
        ForwardMode.EXTEND,
        [4, 1, 5],
        extend_return_logprob=True,
        extend_logprob_start_lens_cpu=[0, 0, 3],
        extend_logprob_pruned_lens_cpu=[4, 1, 2],
        top_logprobs_nums=[0, 0, 0],
        token_ids_logprobs=[None, None, None],
        extend_input_logprob_token_ids_gpu=_ids(7, seed=1),
    )
    out = runner.model.forward(_ids(10), torch.arange(10), metadata)
    assert out.next_token_logits.shape == (3, VOCAB)
    assert out.input_token_logprobs.shape == (7,)
    assert torch.all(out.input_token_logprobs <= 0)


def test_the_next_token_is_a_fixed_function_of_the_last_token_and_its_position() -> None:
    runner = _runner()
    ids = torch.tensor([7, 9, 11, 300, 9, 11])
    same = runner.model.forward(ids, torch.tensor([0, 1, 2, 0, 1, 2]), _extend(ForwardMode.EXTEND, [3, 3]))
    first, second = same.next_token_logits
    assert torch.equal(first, second)  # both end with token 11 at position 2: greedy decoding is deterministic
    moved = runner.model.forward(ids, torch.tensor([0, 1, 2, 0, 1, 5]), _extend(ForwardMode.EXTEND, [3, 3]))
    first, second = moved.next_token_logits
    assert not torch.equal(first, second)  # the same token later in a sequence: another next token


def test_greedy_outputs_do_not_fall_into_a_short_cycle() -> None:
    """A function of the previous token alone sends every sequence into one of a few short cycles
    (then a draft's acceptance is that cycle's, not the model pair's): positions break them."""
    runner = _runner()
    token, out = 5, []
    for pos in range(200):
        logits = runner.model.forward(torch.tensor([token]), torch.tensor([pos]), _decode()).next_token_logits
        token = int(logits.argmax())
        out.append(token)
    assert len(set(out)) > 50


def test_models_of_the_same_weights_agree_at_every_position() -> None:
    """The position vectors are one table for every model (a seeded draw), so a self-draft is
    accepted everywhere and a perturbed draft only where its weights change the argmax."""
    a, b = _runner(), _runner()
    ids, positions = _ids(64), torch.arange(1000, 1064)
    meta = _decode()
    assert torch.equal(
        a.model.forward(ids, positions, meta).next_token_logits, b.model.forward(ids, positions, meta).next_token_logits
    )


def test_an_embedding_request_still_runs_the_full_model() -> None:
    runner = _runner()
    assert runner.model.forward(_ids(3), torch.arange(3), None, get_embedding=True) == "full model"
    assert runner.model.layer_calls == 1


def test_install_is_idempotent_and_leaves_unfit_models_alone() -> None:
    runner = _runner()
    stand_in = runner.model.forward
    assert isinstance(stand_in, EmulatedForward) and is_installed(runner.model)
    assert install(runner) and runner.model.forward is stand_in

    eagle3_target = TinyCausalLm()
    eagle3_target.capture_aux_hidden_states = True
    assert not install(SimpleNamespace(model=eagle3_target)) and not is_installed(eagle3_target)

    no_head = torch.nn.Linear(2, 2)
    assert not install(SimpleNamespace(model=no_head)) and not is_installed(no_head)


def _agreement(target: SimpleNamespace, draft_model: TinyCausalLm, lag: int = 0, n: int = 4000) -> float:
    """Share of (token, position) cells where the draft's next token is the target's."""
    ids, positions = _ids(n, seed=3), torch.arange(n) + 100
    want = target.model.forward(ids, positions, _decode()).next_token_logits.argmax(-1)
    got = draft_model.forward(ids, positions - lag, _decode()).next_token_logits.argmax(-1)
    return float((want == got).float().mean())


@pytest.mark.parametrize("acceptance", [0.0, 0.5, 0.8, 1.0])
def test_a_draft_agrees_with_its_target_at_the_stated_acceptance(acceptance: float) -> None:
    target = _runner()
    draft = SimpleNamespace(model=TinyCausalLm(seed=1))  # its own weights: the stand-in uses the target's
    assert install_draft(draft, target, acceptance, position_offset=1)
    assert _agreement(target, draft.model, lag=1) == pytest.approx(acceptance, abs=0.03)
    assert draft.model.layer_calls == 0


def test_a_draft_needs_its_targets_stand_in() -> None:
    target = SimpleNamespace(model=TinyCausalLm())  # full forward: no stand-in to follow
    draft = SimpleNamespace(model=TinyCausalLm(seed=1))
    assert not install_draft(draft, target, 0.8)
    assert not is_installed(draft.model)
