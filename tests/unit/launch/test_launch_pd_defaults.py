"""launch_server's CPU settings for PD disaggregation (the notes' PD section), applied only
to prefill/decode workers and never over the user's own flags."""

from __future__ import annotations

import os

import pytest

import launch_checks
from launch_argv import CPU_PD_ENV, _with_cpu_defaults


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in CPU_PD_ENV:
        monkeypatch.delenv(name, raising=False)


def test_prefill_and_decode_workers_get_mooncake_tcp_and_page_size_one() -> None:
    for mode in ("prefill", "decode"):
        argv = _with_cpu_defaults(["--disaggregation-mode", mode])
        assert _value(argv, "--disaggregation-transfer-backend") == "mooncake_tcp"
        assert _value(argv, "--page-size") == "1"
        assert _value(argv, "--mem-fraction-static") == "0.8" and argv.count("--mem-fraction-static") == 1
        assert os.environ["SGLANG_DISAGG_PREFILL_EARLY_SEND_CACHED_PREFIX"] == "0"
        assert os.environ["SGLANG_HOST_IP"] == "127.0.0.1"


def test_only_decode_workers_keep_retracted_kv_in_cpu_tensors() -> None:
    decode = _with_cpu_defaults(["--disaggregation-mode", "decode"])
    assert _value(decode, "--disaggregation-decode-retraction-backup") == "cpu_tensor"
    for argv in (["--disaggregation-mode", "prefill"], []):
        assert "--disaggregation-decode-retraction-backup" not in _with_cpu_defaults(argv)
    own = ["--disaggregation-mode", "decode", "--disaggregation-decode-retraction-backup", "none"]
    argv = _with_cpu_defaults(own)
    assert _value(argv, "--disaggregation-decode-retraction-backup") == "none"
    assert argv.count("--disaggregation-decode-retraction-backup") == 1


def test_co_located_servers_get_no_pd_settings() -> None:
    argv = _with_cpu_defaults([])
    assert "--disaggregation-transfer-backend" not in argv and "--page-size" not in argv
    assert _value(argv, "--mem-fraction-static") == "0.8"  # the CPU share every server gets
    assert "SGLANG_HOST_IP" not in os.environ


def test_the_users_flags_and_environment_win(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLANG_HOST_IP", "10.0.0.5")
    argv = _with_cpu_defaults(["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "nixl"])
    assert (
        _value(argv, "--disaggregation-transfer-backend") == "nixl"
        and argv.count("--disaggregation-transfer-backend") == 1
    )
    assert os.environ["SGLANG_HOST_IP"] == "10.0.0.5"


def test_a_missing_transfer_engine_stops_start_up_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_mooncake(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("mooncake"):
            raise ImportError("No module named 'mooncake'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_mooncake)
    with pytest.raises(SystemExit, match="slo setup installs it"):
        launch_checks._check_transfer_backend("mooncake_tcp")
    launch_checks._check_transfer_backend("nixl")  # not ours to check
