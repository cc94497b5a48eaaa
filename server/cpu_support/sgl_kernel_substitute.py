"""A CPU stand-in for `sgl_kernel`, whose only PyPI builds are CUDA ones.

SGLang's CPU path imports a few `*_cpu` ops at module level and calls some of them while
serving (KV copies, request-to-token-pool writes), and more under speculative decoding (tree
build and verify, draft cache locations: spec_ops.py; the intel_amx backend's attention ops,
registered as `torch.ops.sgl_kernel.*`: cpu_attention_ops.py). All are implemented in plain
torch. Any other name fails at import time like a missing symbol, so SGLang's own
`except ImportError` fallbacks keep working: nothing fails silently.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from server.cpu_support.cpu_attention_ops import register_attention_ops
from server.cpu_support.spec_ops import SPEC_OPS


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Write each request's new KV slots into its row of the req->token table."""
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def _rows_view(address: int, row_bytes: int, rows: int) -> torch.Tensor:
    buffer = (ctypes.c_uint8 * (row_bytes * rows)).from_address(address)
    return torch.frombuffer(buffer, dtype=torch.uint8).view(rows, row_bytes)


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copy KV rows src_loc -> tgt_loc in every layer buffer, addressed by raw pointers (the
    signature SGLang's CPU kernel has); rows are `strides[i]` bytes long."""
    if src_loc.numel() == 0:
        return
    src = src_loc.to(torch.long)
    tgt = tgt_loc.to(torch.long)
    rows = int(torch.maximum(src.max(), tgt.max()).item()) + 1
    for address, row_bytes in zip(data_ptrs.tolist(), strides.tolist()):
        view = _rows_view(int(address), int(row_bytes), rows)
        view[tgt] = view[src].clone()


IMPLEMENTED: dict[str, Callable[..., Any]] = {
    "assign_req_to_token_pool_cpu": assign_req_to_token_pool_cpu,
    "copy_all_layer_kv_cache_cpu": copy_all_layer_kv_cache_cpu,
    **SPEC_OPS,
}
# Submodules SGLang imports from (NGRAM: `from sgl_kernel.speculative import ...`).
SUBMODULES: dict[str, tuple[str, ...]] = {"speculative": ("reconstruct_indices_from_tree_mask",)}


class SubstituteModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"sgl_kernel.{name} is not provided by sglang-slo's CPU substitute for sgl_kernel "
            "(install the CUDA sgl-kernel package, or add a pure-torch port)"
        )


def make_module() -> ModuleType:
    register_attention_ops()  # SGLang's intel_amx backend reads them from torch.ops after `import sgl_kernel`
    module = SubstituteModule("sgl_kernel", __doc__)
    module.__version__ = "0.0.0+sglang-slo-cpu"
    for name, fn in IMPLEMENTED.items():
        setattr(module, name, fn)
    return module


def make_submodule(name: str) -> ModuleType | None:
    """`sgl_kernel.<name>` if SGLang imports ops from it, else None (the import fails)."""
    if name not in SUBMODULES:
        return None
    module = SubstituteModule(f"sgl_kernel.{name}", __doc__)
    for op in SUBMODULES[name]:
        setattr(module, op, IMPLEMENTED[op])
    return module
