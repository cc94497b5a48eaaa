"""launch_server's speculation settings: CPU defaults, the --slo-speculation checks, and the
runtime fixes that let SGLang's intel_amx speculation path run on a CPU without AMX."""

from __future__ import annotations

import types

import pytest

from launch_server import (
    DEFAULT_SPEC_STEPS,
    EMULATED_DRAFT_RATIO,
    _draft_ratio,
    _speculation_settings,
    _with_cpu_defaults,
)
from server.cpu_support import speculation


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(speculation.SPECULATION_ENV, raising=False)  # restored after each test


def _args(**kw: object) -> types.SimpleNamespace:
    base = {
        "slo_speculation": True,
        "slo_spec_steps": DEFAULT_SPEC_STEPS,
        "slo_spec_draft_ratio": None,
        "slo_spec_margin": 0.05,
        "speculative_algorithm": "STANDALONE",
        "speculative_eagle_topk": None,
        "speculative_num_steps": None,
        "speculative_num_draft_tokens": None,
    }
    return types.SimpleNamespace(**{**base, **kw})


def test_cpu_speculation_gets_intel_amx_and_a_larger_pool() -> None:
    argv = _with_cpu_defaults(["--speculative-algorithm", "STANDALONE"])
    assert _value(argv, "--attention-backend") == "intel_amx" and argv.count("--attention-backend") == 1
    assert _value(argv, "--mem-fraction-static") == "0.2"
    assert _with_cpu_defaults([]).count("--attention-backend") == 1  # plain serving keeps torch_native
    assert _value(_with_cpu_defaults([]), "--attention-backend") == "torch_native"


def test_settings_size_sglang_to_the_longest_candidate() -> None:
    args = _args(slo_spec_steps="3,0,1")
    settings = _speculation_settings(args)
    assert settings == {"candidates": [0, 1, 3], "margin": 0.05}
    assert (args.speculative_num_steps, args.speculative_eagle_topk, args.speculative_num_draft_tokens) == (3, 1, 4)


def test_emulation_defaults_the_draft_cost_to_the_emulated_cards() -> None:
    emulated = object()
    assert _draft_ratio(_args(), emulated) == EMULATED_DRAFT_RATIO
    assert _draft_ratio(_args(slo_speculation=False), emulated) == EMULATED_DRAFT_RATIO  # fixed lengths too
    assert _draft_ratio(_args(slo_spec_draft_ratio=0.3), emulated) == 0.3
    assert _draft_ratio(_args(), None) is None  # a real engine: measured from the weights
    assert _draft_ratio(_args(speculative_algorithm="NGRAM"), emulated) is None  # no draft model
    for bad in ({"slo_spec_draft_ratio": -1.0}, {"slo_spec_draft_ratio": 0.2, "speculative_algorithm": None}):
        with pytest.raises(SystemExit, match="--slo-spec-draft-ratio"):
            _draft_ratio(_args(**bad), None)


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"speculative_algorithm": "NGRAM"}, "--slo-speculation"),
        ({"speculative_algorithm": None}, "--slo-speculation"),
        ({"slo_spec_steps": "0"}, "--slo-spec-steps"),
        ({"slo_spec_steps": "1,x"}, "--slo-spec-steps"),
        ({"slo_spec_steps": "1,40"}, "--slo-spec-steps"),
        ({"speculative_eagle_topk": 4}, "--speculative-eagle-topk"),
        ({"slo_spec_margin": -0.1}, "--slo-spec-margin"),
        ({"slo_speculation": False, "slo_spec_steps": "1,2"}, "--slo-spec-steps"),
        ({"slo_speculation": False, "slo_spec_margin": 0.2}, "--slo-spec-margin"),
    ],
)
def test_bad_settings_stop_start_up_naming_the_flag(changes: dict, flag: str) -> None:
    with pytest.raises(SystemExit, match=flag):
        _speculation_settings(_args(**changes))


def test_no_speculation_no_settings() -> None:
    assert _speculation_settings(_args(slo_speculation=False)) is None


class _FakeBackend:
    """The two attributes the fix relies on, recording what the kernels receive."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, list]] = []
        self.extend_metadata = None
        self.draft_decode_metadata = None
        self.extend_attention_fwd = lambda *a: self.calls.append(("extend", list(a)))
        self.decode_attention_fwd = lambda *a: self.calls.append(("decode", list(a)))


def test_the_fixed_backend_passes_its_own_lengths_to_the_kernels() -> None:
    import torch

    backend = speculation._fixed_backend_class(_FakeBackend)()
    args = [f"arg{i}" for i in range(19)]
    backend.extend_attention_fwd(*args)  # no metadata: arguments untouched
    assert backend.calls[-1] == ("extend", args)
    verify_lens = torch.tensor([12, 20], dtype=torch.int32)  # prefix + draft tokens
    backend.extend_metadata = (verify_lens, None, None, None)
    backend.extend_attention_fwd(*args)
    got = backend.calls[-1][1]
    assert torch.equal(got[8], verify_lens.long()) and got[8].dtype == torch.int64
    assert got[:8] == args[:8] and got[9:] == args[9:]
    backend.decode_attention_fwd(*args)
    assert backend.calls[-1] == ("decode", args)
    per_candidate = torch.tensor([9, 9, 10], dtype=torch.int64)
    backend.draft_decode_metadata = (None, per_candidate, None)
    backend.decode_attention_fwd(*args)
    got = backend.calls[-1][1]
    assert got[10] is per_candidate and got[:10] == args[:10] and got[11:] == args[11:]


def test_enabling_keeps_intel_amx_and_lets_ngram_compile() -> None:
    from sglang.kernels.jit.utils import compile as jit_compile
    from sglang.srt.arg_groups import overrides
    from sglang.srt.layers.attention import intel_amx_backend

    speculation.enable_cpu_speculation()
    assert intel_amx_backend.IntelAMXAttnBackend._sglang_slo_fixed is True
    assert overrides.cpu_has_amx_support() is True  # its intel_amx -> torch_native rewrite stays off
    assert jit_compile.DEFAULT_CFLAGS.count("cstddef") == 1
    speculation.enable_cpu_speculation()  # idempotent
    assert jit_compile.DEFAULT_CFLAGS.count("cstddef") == 1
