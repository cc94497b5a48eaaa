"""Speculative decoding on CPUs without AMX: what SGLang 0.5.23 needs at run time.

SGLang's only CPU speculation path is the `intel_amx` attention backend
(../shared/notes/sglang-on-cpu.md, speculative section). It needs
- its two attention ops and the tree/cache-location ops: our pure-torch `sgl_kernel` substitute
  provides them (server/cpu_support/cpu_attention_ops.py, spec_ops.py);
- to stay selected on a CPU without AMX, where SGLang's argument post-processing rewrites it to
  `torch_native` (which has no tree mask and no draft backend). SGLang asks its platform facts
  (`get_platform().has_amx`) and offers `override_platform` to state them: we state that this
  machine serves the AMX backend. The module-level `cpu_has_amx_support()` probes that pick
  AMX-packed weights elsewhere in SGLang are not affected.
Applied in the launcher (before ServerArgs are resolved) and in the scheduler process; no SGLang
file is edited.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("sglang_slo.cpu_speculation")

SPECULATION_ENV = "SGLANG_SLO_CPU_SPECULATION"
_OVERRIDE: list[Any] = []  # the installed platform override, kept for the process's lifetime


def enable_cpu_speculation() -> None:
    """Idempotent; call before ServerArgs are resolved and before the model runner starts."""
    os.environ[SPECULATION_ENV] = "1"  # the spawned scheduler process applies it too
    if _OVERRIDE:
        return
    from sglang.srt.runtime_context import override_platform

    _OVERRIDE.append(override_platform(has_amx=True).install())
    logger.info("CPU speculative decoding enabled (intel_amx backend on pure-torch ops)")


def enable_if_requested() -> None:
    if os.environ.get(SPECULATION_ENV) == "1":
        enable_cpu_speculation()
