"""A CPU stand-in for `sgl_kernel`, whose only PyPI builds are CUDA ones.

SGLang's CPU path imports a few `*_cpu` ops at module level and calls some of them while
serving (KV copies, request-to-token-pool writes). Those are implemented here in plain torch.
Names SGLang imports at module level but does not call in plain CPU serving resolve to stubs
that raise, naming the op, when called. Any other name fails at import time like a missing
symbol, so SGLang's own `except ImportError` fallbacks keep working: nothing fails silently.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch


class MissingCpuKernel(NotImplementedError):
    pass


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
}


def _missing(qualified: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise MissingCpuKernel(
            f"{qualified} has no CPU implementation in sglang-slo's sgl_kernel substitute; "
            "this SGLang feature needs the CUDA sgl-kernel package or a pure-torch port"
        )

    fail.__name__ = qualified.rsplit(".", 1)[-1]
    fail.__qualname__ = qualified
    return fail


# Imported at module level by SGLang's CPU path; only called by features we do not run on CPU
# (speculative decoding). Calling one raises MissingCpuKernel naming it.
CALL_TIME_STUBS = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "build_draft_decode_metadata_cpu",
)


class SubstituteModule(ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise AttributeError(
            f"sgl_kernel.{name} is not provided by sglang-slo's CPU substitute for sgl_kernel "
            "(install the CUDA sgl-kernel package, or add a pure-torch port)"
        )


def make_module() -> ModuleType:
    module = SubstituteModule("sgl_kernel", __doc__)
    module.__version__ = "0.0.0+sglang-slo-cpu"
    for name, fn in IMPLEMENTED.items():
        setattr(module, name, fn)
    for name in CALL_TIME_STUBS:
        setattr(module, name, _missing(f"sgl_kernel.{name}"))
    return module
