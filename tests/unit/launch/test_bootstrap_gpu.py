"""./slo setup on a GPU machine whose venv had a CPU set-up: the script's GPU branch, run against
a stand-in interpreter that records what it is asked (no package is installed, no real venv is
touched): the CPU import hook and Mooncake's non-CUDA wheel go, SGLang's own pins come in, and a
CPU torch build that satisfied the pin is replaced by the CUDA one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SHIM = r"""#!/usr/bin/env bash
echo "$*" >> "$SHIM_LOG"
case "$1" in
  -c)
    case "$2" in
      *torch.version.cuda*) [ -f "$SHIM_STATE/cuda-build" ] && exit 0 || exit 1 ;;
      *"__version__.split"*) echo "2.11.0" ;;
      *"print(torch.__version__)"*) echo "2.11.0+cpu" ;;
      *is_available*) exit 0 ;;
    esac ;;
  -m)
    if [ "$2" = pip ] && [[ "$*" == *--force-reinstall* ]]; then touch "$SHIM_STATE/cuda-build"; fi ;;
esac
exit 0
"""


def _run_gpu_setup(tmp_path: Path, cpu_torch: bool) -> list[str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    shim = venv / "bin" / "python"
    shim.write_text(SHIM)
    shim.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    if not cpu_torch:
        (state / "cuda-build").touch()
    log = tmp_path / "calls.log"
    env = {
        **os.environ,
        "SGLANG_SLO_VENV": str(venv),
        "SGLANG_SLO_FLAVOUR": "gpu",
        "SHIM_LOG": str(log),
        "SHIM_STATE": str(state),
    }
    done = subprocess.run(
        ["bash", str(ROOT / "setup" / "bootstrap.sh")], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert (venv / ".sglang-slo-installed").read_text().startswith("gpu-")
    return log.read_text().splitlines()


@pytest.mark.parametrize("cpu_torch", [True, False])
def test_a_gpu_set_up_after_a_cpu_one(tmp_path: Path, cpu_torch: bool) -> None:
    calls = _run_gpu_setup(tmp_path, cpu_torch)
    assert "-m server.cpu_support.venv_hook --remove" in calls
    assert any("uninstall -y mooncake-transfer-engine-non-cuda" in c for c in calls)
    install = next(i for i, c in enumerate(calls) if "install -e" in c and "[gpu,test]" in c)
    assert calls.index("-m server.cpu_support.venv_hook --remove") < install
    reinstalled = [c for c in calls if "--force-reinstall" in c]
    assert reinstalled == (
        ["-m pip --disable-pip-version-check -q install --force-reinstall --no-deps torch==2.11.0"] if cpu_torch else []
    )
