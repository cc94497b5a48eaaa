"""launch_server's speculation settings: CPU defaults, the --slo-speculation checks, and the
runtime fixes that let SGLang's intel_amx speculation path run on a CPU without AMX."""

from __future__ import annotations

import types

import pytest

from launch_argv import _with_cpu_defaults
from launch_checks import _draft_ratio, _speculation_settings
from launch_slo_args import DEFAULT_SPEC_STEPS, EMULATED_DRAFT_RATIO
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


def test_cpu_speculation_gets_intel_amx() -> None:
    argv = _with_cpu_defaults(["--speculative-algorithm", "STANDALONE"])
    assert _value(argv, "--attention-backend") == "intel_amx" and argv.count("--attention-backend") == 1
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


_RESOLVE = """
import sys
from server.cpu_support import activate
activate()
from launch_server import build_parser, _with_cpu_defaults
from sglang.srt.arg_groups.overrides import resolution_result
from sglang.srt.server_args import ServerArgs

def backend():
    # what the CPU speculation defaults ask for, without the launcher enabling anything itself
    argv = _with_cpu_defaults(["--model-path", sys.argv[1], "--attention-backend", "intel_amx"])
    record = ServerArgs.from_cli_args(build_parser().parse_args(argv))
    record.resolve_once()
    return resolution_result(record, "attention_backend")

print("plain", backend())
from server.cpu_support.speculation import enable_cpu_speculation
enable_cpu_speculation()
print("enabled", backend())
"""


def test_enabling_keeps_sglang_on_the_intel_amx_backend_through_resolution(tmp_path) -> None:
    """SGLang's argument resolution rewrites intel_amx to torch_native (no tree mask, no draft
    backend: speculation would silently run without our ops) on a CPU without AMX, unless the
    platform says it serves AMX. Resolved in a fresh interpreter: the override is process-wide."""
    import subprocess
    import sys
    from pathlib import Path

    from server.models import ensure_tiny_model

    root = Path(__file__).resolve().parents[3]
    script = tmp_path / "resolve.py"
    script.write_text(_RESOLVE)
    env = {**__import__("os").environ, "PYTHONPATH": f"{root}:{root / 'launch'}"}
    env.pop(speculation.SPECULATION_ENV, None)
    proc = subprocess.run(
        [sys.executable, str(script), str(ensure_tiny_model())],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith(("plain", "enabled"))]
    # SGLang's own fact, not torch's tile probe: a CPU with AMX tiles but without SGLang's AMX
    # kernels (the CPU build of sgl-kernel) is served by torch_native too.
    platform_probe = "from sglang.srt.runtime_context import get_platform; print(get_platform().has_amx)"
    has_amx = "True" in subprocess.run([sys.executable, "-c", platform_probe], capture_output=True, text=True).stdout
    assert lines == [f"plain {'intel_amx' if has_amx else 'torch_native'}", "enabled intel_amx"]


@pytest.mark.parametrize(
    ("algorithm", "draft", "mixed"), [("EAGLE", "tiny-eagle", True), ("STANDALONE", "tiny-draft", False)]
)
def test_an_emulated_slo_server_keeps_mixed_batches_where_sglang_verifies_beside_a_prefill(
    algorithm: str, draft: str, mixed: bool
) -> None:
    """The launcher asks for mixed batches under an SLO policy on an emulated card, speculating or
    not; SGLang's own resolution keeps them for EAGLE (its decodes then skip drafting in a mixed
    step) and turns them off for STANDALONE."""
    from launch_argv import _resolve_model
    from launch_checks import check_slo_args
    from launch_server import build_parser, resolved_fields
    from server import emulation
    from server.cpu_support import activate

    activate()
    from sglang.srt.server_args import ServerArgs

    argv = ["--model-path", "tiny", "--slo-policy", "edf", "--speculative-algorithm", algorithm]
    args = build_parser().parse_args(
        _resolve_model(_with_cpu_defaults([*argv, "--speculative-draft-model-path", draft]))
    )
    check_slo_args(args, emulation.resolve("h100"), on_cpu=True)
    assert args.enable_mixed_chunk is True
    assert resolved_fields(ServerArgs.from_cli_args(args), "enable_mixed_chunk") == (mixed,)
