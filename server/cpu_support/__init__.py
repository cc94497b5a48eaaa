"""Running real SGLang on machines with no GPU, set up automatically.

`activate()` must run before anything imports sglang: the launcher calls it, and the CPU
bootstrap installs a .pth hook so every interpreter in the project's venv (test clients,
`sglang.bench_serving`, frontend programs) gets it too. Nothing in SGLang's installed files
is edited.
"""

from __future__ import annotations

import os

from server.cpu_support.import_hooks import install_import_hooks


def activate() -> None:
    """Put SGLang on its CPU engine and make its CUDA-only imports resolvable."""
    os.environ.setdefault("SGLANG_USE_CPU_ENGINE", "1")
    install_import_hooks()


def activate_if_requested() -> None:
    """In processes spawned by the launcher: activate when it chose the CPU engine."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        install_import_hooks()
