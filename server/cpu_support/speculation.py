"""Speculative decoding on CPUs without AMX: the runtime fixes SGLang 0.5.17 needs.

Measured (../shared/notes/sglang-on-cpu.md, speculative section): SGLang's only CPU speculation
path is the `intel_amx` attention backend. It needs
- its two attention ops and the tree/cache-location ops: our pure-torch `sgl_kernel` substitute
  provides them (server/cpu_support/cpu_attention_ops.py, spec_ops.py);
- to stay selected on a CPU without AMX, where SGLang's argument post-processing rewrites it to
  `torch_native` (which has no tree mask and no draft backend);
- a fix for an upstream bug: its forward_extend and forward_decode pass `forward_batch.seq_lens`
  to the kernel instead of the lengths they computed, so a verify pass loses its draft tokens
  and a draft step its drafted prefix;
- NGRAM's C++ matcher compiled with `<cstddef>` included (g++ 12 needs it).
All are applied here at runtime, in the launcher and in the scheduler process; no SGLang file is
edited. This is the only module besides the adapters that touches SGLang internals.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger("sglang_slo.cpu_speculation")

SPECULATION_ENV = "SGLANG_SLO_CPU_SPECULATION"
_EXTEND_SEQ_LENS_ARG = 8  # position of seq_lens in extend_attention_cpu's arguments
_DECODE_SEQ_LENS_ARG = 10  # ... and in decode_attention_cpu's
_applied = False


def _int64(t: Any) -> Any:
    import torch

    return t if t.dtype == torch.int64 else t.to(torch.int64)


def _fixed_backend_class(base: type) -> type:
    """IntelAMXAttnBackend whose kernels receive the lengths the backend itself computed."""

    class SeqLensFixedIntelAMXAttnBackend(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            extend, decode = self.extend_attention_fwd, self.decode_attention_fwd

            def extend_fwd(*a: Any) -> Any:
                a = list(a)
                if self.extend_metadata is not None:  # prefix + draft tokens in a verify
                    a[_EXTEND_SEQ_LENS_ARG] = _int64(self.extend_metadata[0])
                return extend(*a)

            def decode_fwd(*a: Any) -> Any:
                a = list(a)
                if self.draft_decode_metadata is not None:  # per-candidate lengths in a draft step
                    a[_DECODE_SEQ_LENS_ARG] = _int64(self.draft_decode_metadata[1])
                return decode(*a)

            self.extend_attention_fwd, self.decode_attention_fwd = extend_fwd, decode_fwd

    return SeqLensFixedIntelAMXAttnBackend


def _keep_intel_amx() -> None:
    """SGLang's post-processing asks `cpu_has_amx_support()` (imported into its overrides
    module) before rewriting intel_amx to torch_native; our ops need no AMX."""
    from sglang.srt.arg_groups import overrides

    overrides.cpu_has_amx_support = lambda: True


def _ngram_compiles() -> None:
    from sglang.kernels.jit.utils import compile as jit_compile

    flags = jit_compile.DEFAULT_CFLAGS
    if "cstddef" not in flags:
        flags += ["-include", "cstddef"]


def enable_cpu_speculation() -> None:
    """Idempotent; call before ServerArgs are resolved and before the model runner starts."""
    global _applied
    if _applied:
        return
    os.environ[SPECULATION_ENV] = "1"  # the spawned scheduler process applies them too
    from sglang.srt.layers.attention import intel_amx_backend

    base = intel_amx_backend.IntelAMXAttnBackend
    if not getattr(base, "_sglang_slo_fixed", False):
        fixed = _fixed_backend_class(base)
        fixed._sglang_slo_fixed = True
        intel_amx_backend.IntelAMXAttnBackend = fixed  # the registry and draft backends look it up here
    _keep_intel_amx()
    _ngram_compiles()
    _applied = True
    logger.info("CPU speculative decoding enabled (intel_amx backend on pure-torch ops)")


def enable_if_requested() -> None:
    if os.environ.get(SPECULATION_ENV) == "1":
        enable_cpu_speculation()
