"""The scheduler process's entry point, handed to SGLang's launch_server (spawn-importable).

SGLang spawns the scheduler in a fresh interpreter. The CPU engine's import hooks and runtime
fixes must be in place before that process imports sglang, so this module imports nothing heavy
at the top and loads the adapter only after activating them.
"""

from __future__ import annotations

from typing import Any

from server.cpu_support import activate_if_requested
from server.cpu_support.speculation import enable_if_requested as enable_cpu_speculation_if_requested


def run_slo_scheduler_process(*args: Any, **kwargs: Any) -> None:
    activate_if_requested()  # a spawned child outside the project venv has no .pth hook
    enable_cpu_speculation_if_requested()  # CPU speculation: the launcher's runtime fixes, here too
    from scheduler.sglang_scheduler import install_slo_scheduler

    install_slo_scheduler()
    from sglang.srt.managers import scheduler as sglang_scheduler_module

    sglang_scheduler_module.run_scheduler_process(*args, **kwargs)
