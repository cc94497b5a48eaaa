"""The pure-torch sgl_kernel attention ops must match SGLang's own Triton kernels.

References run SGLang 0.5.17's Triton `decode_attention_fwd` / `extend_attention_fwd` under the
Triton interpreter (TRITON_INTERPRET=1 has to be set before triton is imported, hence one child
process for all cases). Encoder-decoder offsets and cross-attention, which the Triton kernels take
through a different index layout, are checked against an explicit per-query loop instead.

Sliding window: the op gets `layer.sliding_window_size + 1` = W and lets a query see the last W
positions including itself. That is Triton extend's `q <= k + (W - 1)` rule; Triton decode has no
window argument, so its reference is fed exactly those last W tokens as kv_indices.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from server.cpu_support.cpu_attention_ops import (
    decode_attention_cpu,
    extend_attention_cpu,
    register_attention_ops,
)

NUM_SLOTS = 512
POOL_ROWS = 8
POOL_WIDTH = 96

TRITON_CHILD = textwrap.dedent(
    """
    import importlib
    import importlib.util
    import os
    import sys
    import types

    os.environ["TRITON_INTERPRET"] = "1"
    import torch

    # Load SGLang's own kernel files without running sglang/__init__ (transformers, sklearn, ...:
    # tens of seconds on a busy 2-core box). Only the platform probes they import are stubbed, with
    # the values they have on a CPU-only machine.
    root = importlib.util.find_spec("sglang").submodule_search_locations[0]
    for pkg, path in (
        ("sglang", root),
        ("sglang.srt", os.path.join(root, "srt")),
        ("sglang.kernels", os.path.join(root, "kernels")),
        ("sglang.kernels.ops", os.path.join(root, "kernels", "ops")),
        ("sglang.kernels.ops.attention", os.path.join(root, "kernels", "ops", "attention")),
    ):
        module = types.ModuleType(pkg)
        module.__path__ = [path]
        sys.modules[pkg] = module
    probes = types.ModuleType("sglang.srt.utils")
    probes.is_cuda = probes.is_hip = probes.is_gfx95_supported = probes.is_gfx1250_supported = lambda: False
    probes.get_device_core_count = lambda device_index=0: 0
    sys.modules["sglang.srt.utils"] = probes
    decode_attention_fwd = importlib.import_module("sglang.kernels.ops.attention.decode_attention").decode_attention_fwd
    extend_attention_fwd = importlib.import_module("sglang.kernels.ops.attention.extend_attention").extend_attention_fwd

    results = {}
    for name, kind, a in torch.load(sys.argv[1]):
        q = a["q"]
        out = torch.zeros(q.shape[0], q.shape[1], a["v_buffer"].shape[-1])
        if kind == "extend":
            extend_attention_fwd(
                q, a["k_extend"], a["v_extend"], out, a["k_buffer"], a["v_buffer"],
                a["qo_indptr"], a["kv_indptr"], a["kv_indices"], a["custom_mask"], True,
                a["mask_indptr"], a["max_len_extend"], 1.0, 1.0, sm_scale=a["sm_scale"],
                logit_cap=a["logit_cap"], sliding_window_size=a["sliding_window_size"], sinks=a["sinks"],
            )
        else:
            bs, heads, splits = q.shape[0], q.shape[1], 2
            logits = torch.empty(bs, heads, splits, out.shape[-1])
            lse = torch.empty(bs, heads, splits)
            decode_attention_fwd(
                q, a["k_buffer"], a["v_buffer"], out, a["kv_indptr"], a["kv_indices"], logits, lse,
                torch.full((bs,), splits, dtype=torch.int32), splits, a["sm_scale"], 1.0, 1.0,
                logit_cap=a["logit_cap"], sinks=a["sinks"],
            )
        results[name] = out
    torch.save(results, sys.argv[2])
    """
)


def _indptr(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _random_tree_mask(n: int, gen: torch.Generator) -> torch.Tensor:
    """Ancestor-or-self visibility of a random tree over n draft tokens (token 0 = root)."""
    mask = torch.eye(n, dtype=torch.bool)
    for j in range(1, n):
        parent = int(torch.randint(0, j, (1,), generator=gen))
        mask[j] |= mask[parent]
    return mask


def _pool(gen: torch.Generator, num_kv_heads: int, head_dim: int, head_dim_v: int, dtype: torch.dtype):
    k_buffer = torch.randn(NUM_SLOTS, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_buffer = torch.randn(NUM_SLOTS, num_kv_heads, head_dim_v, generator=gen).to(dtype)
    free_slots = torch.randperm(NUM_SLOTS - 1, generator=gen) + 1  # slot 0 stays unused, like SGLang's pool
    req_to_token = torch.zeros(POOL_ROWS, POOL_WIDTH, dtype=torch.int32)
    return k_buffer, v_buffer, free_slots, req_to_token


def build_extend_case(
    seed: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    prefix_lens: list[int],
    extend_lens: list[int],
    head_dim_v: int | None = None,
    dtype: torch.dtype = torch.float32,
    logit_cap: float = 0.0,
    window: int = 0,
    sinks: bool = False,
    tree: str | None = None,
    mask_layout: str = "qlen",
    index_dtype: torch.dtype = torch.int64,
) -> dict[str, Any]:
    """Op arguments in intel_amx_backend.forward_extend order, plus the Triton reference's view."""
    gen = torch.Generator().manual_seed(seed)
    head_dim_v = head_dim_v or head_dim
    k_buffer, v_buffer, free_slots, req_to_token = _pool(gen, num_kv_heads, head_dim, head_dim_v, dtype)
    bs = len(prefix_lens)
    rows = torch.randperm(POOL_ROWS, generator=gen)[:bs]
    total = sum(extend_lens)
    q = torch.randn(total, num_heads, head_dim, generator=gen).to(dtype)
    k_extend = torch.randn(total, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_extend = torch.randn(total, num_kv_heads, head_dim_v, generator=gen).to(dtype)
    used = 0
    kv_indices, qlen_masks, full_masks = [], [], []
    starts = _indptr(extend_lens)[:-1]
    for b, (p, e) in enumerate(zip(prefix_lens, extend_lens)):
        slots = free_slots[used : used + p + e]
        used += p + e
        req_to_token[rows[b], : p + e] = slots.to(torch.int32)
        # The backend has already written the new tokens' K/V into the pool.
        k_buffer[slots[p:]] = k_extend[starts[b] : starts[b] + e]
        v_buffer[slots[p:]] = v_extend[starts[b] : starts[b] + e]
        kv_indices.append(slots[:p])
        if tree == "chain":
            draft = torch.ones(e, e, dtype=torch.bool).tril()
        else:
            draft = _random_tree_mask(e, gen)
        qlen_masks.append(draft.reshape(-1))
        full = torch.ones(e, p + e, dtype=torch.bool)
        full[:, p:] = draft
        full_masks.append(full.reshape(-1))
    seq_lens = torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens)], dtype=torch.int64)
    tree_mask = None
    if tree is not None:
        tree_mask = torch.cat(qlen_masks if mask_layout == "qlen" else full_masks)
    sink_values = torch.randn(num_heads, generator=gen) if sinks else None
    sm_scale = 1.0 / math.sqrt(head_dim)
    op_args = [
        q,
        k_extend,
        v_extend,
        torch.full((total, num_heads, head_dim_v), float("nan"), dtype=dtype),
        k_buffer,
        v_buffer,
        1.0,  # key_scale
        1.0,  # value_scale
        req_to_token,
        rows.to(index_dtype),
        seq_lens,
        torch.tensor(extend_lens, dtype=torch.int32),
        starts.to(torch.int32),
        max(extend_lens),
        sm_scale,
        logit_cap,
        False,
        window,
        None,
        sink_values.to(dtype) if sink_values is not None else None,
        tree_mask,
        True,  # is_causal
    ]
    triton_args = {
        "q": q.float(),
        "k_extend": k_extend.float(),
        "v_extend": v_extend.float(),
        "k_buffer": k_buffer.float(),
        "v_buffer": v_buffer.float(),
        "qo_indptr": _indptr(extend_lens),
        "kv_indptr": _indptr(prefix_lens),
        "kv_indices": torch.cat(kv_indices).to(torch.int64),
        "custom_mask": torch.cat(full_masks) if tree is not None else None,
        "mask_indptr": _indptr([e * (p + e) for p, e in zip(prefix_lens, extend_lens)]) if tree else None,
        "max_len_extend": max(extend_lens),
        "sm_scale": sm_scale,
        "logit_cap": logit_cap,
        "sliding_window_size": window - 1 if window > 0 else -1,
        "sinks": sink_values.to(dtype).float() if sink_values is not None else None,
    }
    return {"kind": "extend", "op_args": op_args, "triton": triton_args, "dtype": dtype}


def build_decode_case(
    seed: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    seq_lens: list[int],
    dtype: torch.dtype = torch.float32,
    logit_cap: float = 0.0,
    window: int = 0,
    sinks: bool = False,
    draft_topk: int = 0,
    index_dtype: torch.dtype = torch.int64,
) -> dict[str, Any]:
    """Op arguments in intel_amx_backend.forward_decode order. With draft_topk > 0 the table is
    expanded per draft candidate like build_draft_decode_metadata_cpu's: candidate rows share
    their request's prefix slots, own their draft slots, and req_pool_indices = arange(bs*topk)."""
    gen = torch.Generator().manual_seed(seed)
    k_buffer, v_buffer, free_slots, req_to_token = _pool(gen, num_kv_heads, head_dim, head_dim, dtype)
    used = 0
    if draft_topk:
        step = 2  # each candidate already holds 2 draft tokens and decodes its 3rd
        rows_list, lens = [], []
        for prefix in seq_lens:
            shared = free_slots[used : used + prefix]
            used += prefix
            for _ in range(draft_topk):
                own = free_slots[used : used + step + 1]
                used += step + 1
                row = len(rows_list)
                req_to_token[row, : prefix + step + 1] = torch.cat([shared, own]).to(torch.int32)
                rows_list.append(row)
                lens.append(prefix + step + 1)
        rows = torch.tensor(rows_list)
    else:
        rows = torch.randperm(POOL_ROWS, generator=gen)[: len(seq_lens)]
        lens = list(seq_lens)
        for b, n in enumerate(lens):
            req_to_token[rows[b], :n] = free_slots[used : used + n].to(torch.int32)
            used += n
    bs = len(lens)
    q = torch.randn(bs, num_heads, head_dim, generator=gen).to(dtype)
    k_new = torch.randn(bs, num_kv_heads, head_dim, generator=gen).to(dtype)
    v_new = torch.randn(bs, num_kv_heads, head_dim, generator=gen).to(dtype)
    loc = torch.stack([req_to_token[rows[b], lens[b] - 1] for b in range(bs)]).to(torch.int64)
    # Stale data at the new slots: the kernel must overwrite it before attending.
    k_buffer[loc] = 100.0
    v_buffer[loc] = 100.0
    k_ref, v_ref = k_buffer.clone(), v_buffer.clone()
    k_ref[loc], v_ref[loc] = k_new, v_new
    firsts = [max(0, n - window) if window > 0 else 0 for n in lens]
    kv_indices = torch.cat([req_to_token[rows[b], firsts[b] : lens[b]] for b in range(bs)])
    sink_values = torch.randn(num_heads, generator=gen).to(dtype) if sinks else None
    sm_scale = 1.0 / math.sqrt(head_dim)
    op_args = [
        q,
        k_buffer,
        v_buffer,
        1.0,  # key_scale
        1.0,  # value_scale
        torch.full((bs, num_heads, head_dim), float("nan"), dtype=dtype),
        k_new,
        v_new,
        loc,
        torch.zeros(bs, num_heads, 8, head_dim + 1),
        req_to_token,
        rows.to(index_dtype),
        torch.tensor(lens, dtype=torch.int64),
        sm_scale,
        logit_cap,
        False,
        window,
        None,
        sink_values,
    ]
    triton_args = {
        "q": q.float(),
        "k_buffer": k_ref.float(),
        "v_buffer": v_ref.float(),
        "kv_indptr": _indptr([n - f for n, f in zip(lens, firsts)]),
        "kv_indices": kv_indices.to(torch.int64),
        "sm_scale": sm_scale,
        "logit_cap": logit_cap,
        "sinks": sink_values.float() if sink_values is not None else None,
    }
    return {"kind": "decode", "op_args": op_args, "triton": triton_args, "dtype": dtype}


GQA = {"num_heads": 4, "num_kv_heads": 2, "head_dim": 16}
MIXED = {"prefix_lens": [0, 7, 40], "extend_lens": [5, 1, 12]}
VERIFY = {"prefix_lens": [3, 20, 11], "extend_lens": [6, 6, 6]}

CASES: dict[str, dict[str, Any]] = {
    "extend_gqa_mixed_lengths": build_extend_case(1, **GQA, **MIXED, index_dtype=torch.int32),
    "extend_mha_logit_cap_sinks": build_extend_case(
        2, num_heads=2, num_kv_heads=2, head_dim=16, **MIXED, logit_cap=2.0, sinks=True
    ),
    "extend_sliding_window": build_extend_case(3, **GQA, prefix_lens=[30, 4], extend_lens=[9, 14], window=6),
    "extend_bf16_value_dim": build_extend_case(4, **GQA, **MIXED, head_dim_v=8, dtype=torch.bfloat16),
    "verify_tree_qlen_layout": build_extend_case(5, **GQA, **VERIFY, tree="tree"),
    # Same data as above (same seed), the mask in the GPU FULL_MASK layout: same Triton reference.
    "verify_tree_full_layout": {
        **build_extend_case(5, **GQA, **VERIFY, tree="tree", mask_layout="full"),
        "reference": "verify_tree_qlen_layout",
    },
    "decode_gqa": build_decode_case(7, **GQA, seq_lens=[1, 9, 70], index_dtype=torch.int32),
    "decode_mha_logit_cap_sinks": build_decode_case(
        8, num_heads=2, num_kv_heads=2, head_dim=16, seq_lens=[5, 33], logit_cap=3.0, sinks=True
    ),
    "decode_sliding_window": build_decode_case(9, **GQA, seq_lens=[3, 12, 40], window=8),
    "decode_bf16": build_decode_case(10, **GQA, seq_lens=[2, 17, 50], dtype=torch.bfloat16),
    "draft_decode_expanded_table": build_decode_case(11, **GQA, seq_lens=[4, 23], draft_topk=3),
}


@pytest.fixture(scope="module")
def triton_reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """All Triton reference outputs, from one interpreter child process."""
    work: Path = tmp_path_factory.mktemp("triton_ref")
    (work / "child.py").write_text(TRITON_CHILD)
    jobs = [(name, case["kind"], case["triton"]) for name, case in CASES.items() if "reference" not in case]
    torch.save(jobs, work / "in.pt")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run(
        [sys.executable, str(work / "child.py"), str(work / "in.pt"), str(work / "out.pt")],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"Triton reference child failed:\n{proc.stderr[-4000:]}")
    return torch.load(work / "out.pt")


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    register_attention_ops()


def _run_op(case: dict[str, Any]) -> tuple[torch.Tensor, list[Any]]:
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in case["op_args"]]
    if case["kind"] == "extend":
        torch.ops.sgl_kernel.extend_attention_cpu(*args)
        return args[3], args
    torch.ops.sgl_kernel.decode_attention_cpu(*args)
    return args[5], args


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    assert actual.dtype == dtype
    assert not torch.isnan(actual).any()
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(actual.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("name", list(CASES))
def test_matches_sglang_triton_kernel(name: str, triton_reference: dict[str, torch.Tensor]) -> None:
    case = CASES[name]
    out, _ = _run_op(case)
    _assert_close(out, triton_reference[case.get("reference", name)], case["dtype"])


def test_register_is_idempotent_with_backend_schemas() -> None:
    register_attention_ops()
    register_attention_ops()
    decode = torch.ops.sgl_kernel.decode_attention_cpu.default._schema
    extend = torch.ops.sgl_kernel.extend_attention_cpu.default._schema
    assert [a.name for a in decode.arguments][-4:] == [
        "is_cross_attn",
        "sliding_window_size",
        "encoder_lens",
        "sinks",
    ]
    assert [a.name for a in decode.arguments][3:5] == ["key_scale", "value_scale"]
    assert len(decode.arguments) == 19
    assert len(extend.arguments) == 22
    assert [a.name for a in extend.arguments][-2:] == ["tree_mask", "is_causal"]


def test_decode_writes_new_kv_at_loc_only() -> None:
    case = CASES["decode_gqa"]
    _, args = _run_op(case)
    k_before, v_before = case["op_args"][1], case["op_args"][2]
    k_after, v_after, k_new, v_new, loc = args[1], args[2], args[6], args[7], args[8]
    torch.testing.assert_close(k_after[loc], k_new, atol=0, rtol=0)
    torch.testing.assert_close(v_after[loc], v_new, atol=0, rtol=0)
    untouched = torch.ones(NUM_SLOTS, dtype=torch.bool)
    untouched[loc] = False
    assert torch.equal(k_after[untouched], k_before[untouched])
    assert torch.equal(v_after[untouched], v_before[untouched])


def test_chain_tree_mask_equals_causal_and_branches_differ() -> None:
    chain = build_extend_case(12, **GQA, **VERIFY, tree="chain")
    causal_args = list(chain["op_args"])
    causal_args[-2] = None  # tree_mask
    causal, _ = _run_op({**chain, "op_args": causal_args})
    chained, _ = _run_op(chain)
    torch.testing.assert_close(chained, causal, atol=0, rtol=0)
    branched, _ = _run_op(CASES["verify_tree_qlen_layout"])
    plain_args = list(CASES["verify_tree_qlen_layout"]["op_args"])
    plain_args[-2] = None
    plain, _ = _run_op({**CASES["verify_tree_qlen_layout"], "op_args": plain_args})
    assert not torch.allclose(branched, plain, atol=1e-3)


def test_cache_scales_dequantise_what_is_read_from_the_pools() -> None:
    """key_scale/value_scale (an fp8 cache's layer scales) multiply the cached K/V: the same as
    attending over pools holding the scaled values."""
    for name in ("extend_gqa_mixed_lengths", "decode_gqa"):
        case = CASES[name]
        kbuf, vbuf = (1, 2) if case["kind"] == "decode" else (4, 5)
        scale_at = 3 if case["kind"] == "decode" else 6
        scaled_args = list(case["op_args"])
        scaled_args[scale_at : scale_at + 2] = [0.5, 2.0]
        pre_scaled = list(case["op_args"])
        pre_scaled[kbuf] = pre_scaled[kbuf] * 0.5
        pre_scaled[vbuf] = pre_scaled[vbuf] * 2.0
        if case["kind"] == "decode":  # the new token is written unscaled, then read back through the scale
            pre_scaled[6], pre_scaled[7] = pre_scaled[6] * 0.5, pre_scaled[7] * 2.0
        got, _ = _run_op({**case, "op_args": scaled_args})
        want, _ = _run_op({**case, "op_args": pre_scaled})
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert not torch.allclose(got, _run_op(case)[0], atol=1e-3)


def test_non_causal_extend_lets_every_new_token_see_every_other() -> None:
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, ext = 2, 1, 4, 3
    k_buffer, v_buffer, free_slots, req_to_token = _pool(gen, kv_heads, dim, dim, torch.float32)
    req_to_token[0, :ext] = free_slots[:ext].to(torch.int32)
    q = torch.randn(ext, heads, dim, generator=gen)
    k_new, v_new = torch.randn(ext, kv_heads, dim, generator=gen), torch.randn(ext, kv_heads, dim, generator=gen)
    out = torch.empty(ext, heads, dim)
    lens = (torch.tensor([0]), torch.tensor([ext]), torch.tensor([ext], dtype=torch.int32))
    extend_attention_cpu(
        q, k_new, v_new, out, k_buffer, v_buffer, 1.0, 1.0, req_to_token, *lens,
        torch.tensor([0], dtype=torch.int32), ext, 0.5, 0.0, False, 0, None, None, None, False,
    )  # fmt: skip
    everything = [[True] * ext for _ in range(ext)]
    torch.testing.assert_close(out, _loop_attention(q, k_new, v_new, everything, 0.5), atol=1e-5, rtol=1e-5)


def test_tree_mask_of_unknown_layout_is_rejected() -> None:
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in CASES["verify_tree_qlen_layout"]["op_args"]]
    args[-2] = args[-2][:-1]
    with pytest.raises(ValueError, match="tree_mask has"):
        extend_attention_cpu(*args)


def _loop_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: list[list[bool]], scale: float
) -> torch.Tensor:
    """Naive reference: q [n, Hq, D], keys/values [m, Hkv, *], visible[i][j] per query/key."""
    group = q.shape[1] // keys.shape[1]
    out = torch.zeros(q.shape[0], q.shape[1], values.shape[-1])
    for i in range(q.shape[0]):
        for h in range(q.shape[1]):
            idx = [j for j in range(keys.shape[0]) if visible[i][j]]
            logits = torch.tensor([float(q[i, h] @ keys[j, h // group]) * scale for j in idx])
            weights = torch.softmax(logits, dim=0)
            for w, j in zip(weights, idx):
                out[i, h] += w * values[j, h // group]
    return out


def test_encoder_offset_and_cross_attention_match_loop_reference() -> None:
    gen = torch.Generator().manual_seed(13)
    heads, kv_heads, dim = 4, 2, 8
    k_buffer, v_buffer, free_slots, req_to_token = _pool(gen, kv_heads, dim, dim, torch.float32)
    enc, prefix, ext = 5, 3, 4
    row = 2
    req_to_token[row, : enc + prefix + ext] = free_slots[: enc + prefix + ext].to(torch.int32)
    slots = req_to_token[row].to(torch.long)
    q = torch.randn(ext, heads, dim, generator=gen)
    scale = 0.3
    common = (
        k_buffer,
        v_buffer,
        1.0,
        1.0,
        req_to_token,
        torch.tensor([row]),
        torch.tensor([prefix + ext]),
        torch.tensor([ext], dtype=torch.int32),
        torch.tensor([0], dtype=torch.int32),
        ext,
        scale,
        0.0,
    )
    self_out = torch.empty(ext, heads, dim)
    extend_attention_cpu(q, None, None, self_out, *common, False, 0, torch.tensor([enc]), None, None)
    self_keys = slots[enc : enc + prefix + ext]
    causal = [[j <= prefix + i for j in range(prefix + ext)] for i in range(ext)]
    expected = _loop_attention(q, k_buffer[self_keys], v_buffer[self_keys], causal, scale)
    torch.testing.assert_close(self_out, expected, atol=1e-5, rtol=1e-5)

    cross_out = torch.empty(ext, heads, dim)
    extend_attention_cpu(q, None, None, cross_out, *common, True, 0, torch.tensor([enc]), None, None)
    everything = [[True] * enc for _ in range(ext)]
    expected = _loop_attention(q, k_buffer[slots[:enc]], v_buffer[slots[:enc]], everything, scale)
    torch.testing.assert_close(cross_out, expected, atol=1e-5, rtol=1e-5)

    decode_out = torch.empty(1, heads, dim)
    decode_attention_cpu(
        q[:1],
        k_buffer,
        v_buffer,
        1.0,
        1.0,
        decode_out,
        None,
        None,
        torch.empty(0, dtype=torch.long),
        torch.empty(0),
        req_to_token,
        torch.tensor([row]),
        torch.tensor([prefix + ext]),
        scale,
        0.0,
        False,
        0,
        torch.tensor([enc]),
        None,
    )
    all_self = [[True] * (prefix + ext)]
    expected = _loop_attention(q[:1], k_buffer[self_keys], v_buffer[self_keys], all_self, scale)
    torch.testing.assert_close(decode_out, expected, atol=1e-5, rtol=1e-5)


def test_decode_rejects_per_request_lengths_for_candidate_rows() -> None:
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in CASES["draft_decode_expanded_table"]["op_args"]]
    args[12] = args[12][:2]  # one length per request instead of one per draft candidate
    with pytest.raises(ValueError, match="seq_lens"):
        decode_attention_cpu(*args)
