"""The pure-torch speculative-decoding ops (server/cpu_support/spec_ops.py) against SGLang.

Ops with a Triton kernel in SGLang are compared with that kernel run by the Triton
interpreter on CPU tensors. The interpreter must be switched on before triton is imported,
so all reference runs happen in one child python (TRITON_INTERPRET=1) that pulls the
`@triton.jit` functions out of SGLang's installed source files (importing the sglang package
itself takes seconds and needs a GPU-less sgl_kernel). Ops without a Triton kernel are checked
against SGLang's host-side reference where one exists and against hand-derived expectations.

Output buffers start from random contents rather than the callers' fills, so any cell an op
writes that the reference leaves alone (or the reverse) shows up as a mismatch.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from server.cpu_support.spec_ops import (
    SPEC_OPS,
    assign_draft_cache_locs_contiguous_cpu,
    assign_extend_cache_locs_cpu,
    build_draft_decode_metadata_cpu,
    build_tree_kernel_efficient_cpu,
    fill_accept_out_cache_loc_cpu,
    fill_bonus_tokens_cpu,
    reconstruct_indices_from_tree_mask,
    rotate_input_ids_cpu,
    verify_tree_greedy_cpu,
)

SGLANG_ROOT = Path(importlib.util.find_spec("sglang").submodule_search_locations[0])
SPEC_KERNELS = SGLANG_ROOT / "kernels" / "ops" / "speculative"
SEEDS = range(20)

# --- the Triton reference runner (child process) ------------------------------------------------

CHILD = r"""
import ast, sys
import torch, triton, triton.language as tl

kernel_dir, in_path, out_path = sys.argv[1:4]

def load(file, names):
    # Exec just the named @triton.jit functions and the @triton.jit helpers they may call,
    # compiled against their real file so triton can read their source; the modules' own
    # imports (sglang, sgl_kernel) are skipped.
    path = f"{kernel_dir}/{file}"
    tree = ast.parse(open(path).read(), path)
    def jitted(n):
        return any("jit" in ast.unparse(d) for d in n.decorator_list)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    body = [n for n in functions if n.name in names or jitted(n)]
    missing = set(names) - {n.name for n in body}
    assert not missing, f"{path} lacks {missing}"
    ns = {"triton": triton, "tl": tl}
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), ns)
    return [ns[n] for n in names]

build, verify = load("spec_tree.py", ["sgl_build_tree_kernel_efficient_triton", "verify_tree_greedy_kernel_triton"])
extend, draft, kv_indices = load(
    "cache_locs.py",
    ["assign_extend_cache_locs", "assign_draft_cache_locs_contiguous", "generate_draft_decode_kv_indices"],
)
bonus, accept = load("eagle.py", ["fill_bonus_tokens", "fill_accept_out_cache_loc"])
(rotate,) = load("multi_layer_eagle.py", ["rotate_input_ids_kernel"])

def pow2(x):
    return 1 if x <= 1 else 1 << (x - 1).bit_length()

def run_build(c):
    bs = c["seq_lens"].numel()
    pl = c["parent_list"]
    # same launch as sglang.srt.speculative.eagle_utils.sgl_build_tree_kernel_triton
    build[(bs,)](pl, c["selected_index"], c["seq_lens"], torch.cumsum(c["seq_lens"], 0) - c["seq_lens"],
                 c["tree_mask"], c["positions"], c["retrieve"][0], c["retrieve"][1], c["retrieve"][2],
                 topk=c["topk"], depth=c["depth"], draft_token_num=c["dtn"], tree_mask_mode=c["mode"],
                 batch_size=bs, parent_list_stride=pl.stride(0) if pl.dim() > 1 else pl.shape[0],
                 selected_index_stride=c["selected_index"].stride(0))
    return {k: c[k] for k in ("tree_mask", "positions", "retrieve")}

def run_verify(c):
    bs, n = c["candidates"].shape
    verify[(bs,)](c["predicts"], c["accept_index"], c["accept_token_num"], c["candidates"],
                  c["retrieve_index"], c["retrieve_next_token"], c["retrieve_next_sibling"], c["target_predict"],
                  batch_size=bs, num_speculative_tokens=c["accept_index"].shape[1], num_draft_tokens=n)
    return {k: c[k] for k in ("predicts", "accept_index", "accept_token_num")}

def run_extend(c):
    bs = c["req_pool_indices"].numel()
    extend[(bs,)](c["req_pool_indices"], c["req_to_token"], c["start"], c["end"], c["out"],
                  c["req_to_token"].shape[1], pow2(bs))
    return {"out": c["out"]}

def run_draft(c):
    bs = c["req_pool_indices"].numel()
    draft[(bs,)](c["req_pool_indices"], c["req_to_token"], c["seq_lens"], c["out"],
                 c["req_to_token"].shape[1], c["topk"], c["num_steps"])
    return {"out": c["out"]}

def run_kv_indices(c):
    bs, topk, steps = c["seq_lens"].numel(), c["topk"], c["num_steps"]
    total = topk * int(c["seq_lens"].sum()) + bs * topk * steps
    out = torch.full((steps, total), -1, dtype=torch.int64)
    indptr = torch.zeros((steps, bs * topk + 1), dtype=torch.int64)
    kv_indices[(steps, bs, topk)](c["req_pool_indices"], c["req_to_token"], c["seq_lens"], out, indptr,
                                  c["seq_lens"].repeat_interleave(topk), c["req_to_token"].shape[1],
                                  out.shape[1], indptr.shape[1], pow2(bs), pow2(steps), pow2(bs * topk), 1)
    return {"kv_indices": out, "kv_indptr": indptr}

def run_bonus(c):
    bs = c["accept_lens"].numel()
    bonus[(bs,)](c["accept_tokens"], c["accept_lens"], c["bonus"], c["accept_tokens"].shape[1])
    return {"bonus": c["bonus"]}

def run_accept(c):
    size = c["accept_index"].numel()
    accept[(size,)](c["accept_index"], c["out_cache_loc"], c["accept_out"], pow2(size))
    return {"accept_out": c["accept_out"]}

def run_rotate(c):
    sel = c["select_index"]
    bs = c["seq_lens"].numel()
    rotate[(bs,)](c["input_ids"], c["start_loc"], c["seq_lens"], c["topk_index"], sel,
                  BLOCK_SIZE=4096 if sel is not None else 8)
    return {"input_ids": c["input_ids"]}

RUN = {"build": run_build, "verify": run_verify, "extend": run_extend, "draft": run_draft,
       "kv_indices": run_kv_indices, "bonus": run_bonus, "accept": run_accept, "rotate": run_rotate}
cases = torch.load(in_path)
torch.save({op: [RUN[op](dict(c)) for c in items] for op, items in cases.items()}, out_path)
"""


def _clone(case: dict[str, Any]) -> dict[str, Any]:
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in case.items()}


# --- case generators ------------------------------------------------------------------------------


def _eagle_request(g: torch.Generator, topk: int, depth: int, dtn: int, closed: bool) -> tuple[list, list]:
    """One request's (parent_list, selected_index) laid out the way EAGLE's draft loop does
    (spec_utils.select_top_k_tokens + eagle_utils.organize_draft_results): step 0 has topk
    candidates under the root; each later step has topk * topk candidates, block k being the
    children of the k-th candidate expanded from the previous step. Scores shrink down the
    tree, so the top dtn - 1 are ancestor-closed; `closed=False` picks a random subset
    instead (parents may be missing: the kernels' malformed-tree path)."""
    n_cand = topk + (depth - 1) * topk * topk
    scores = torch.zeros(n_cand)
    scores[:topk] = torch.rand(topk, generator=g) + 0.05
    parent_list = list(range(-1, topk))
    expanded = list(range(topk))
    for step in range(1, depth):
        base = topk + (step - 1) * topk * topk
        for k, cand in enumerate(expanded):
            scores[base + k * topk : base + (k + 1) * topk] = scores[cand] * (torch.rand(topk, generator=g) + 0.05)
        if step < depth - 1:
            expanded = (torch.topk(scores[base : base + topk * topk], topk).indices + base).tolist()
            parent_list += expanded
    if depth == 1:
        parent_list = []  # organize_draft_results: no non-root parents
    if closed:
        chosen = torch.topk(scores, dtn - 1).indices
    else:
        chosen = torch.randperm(n_cand, generator=g)[: dtn - 1]
    return parent_list, sorted(chosen.tolist())


def _build_case(
    g: torch.Generator, bs: int, topk: int, depth: int, dtn: int, mode: int, closed: bool = True
) -> dict[str, Any]:
    rows = [_eagle_request(g, topk, depth, dtn, closed) for _ in range(bs)]
    width = topk * (depth - 1) + 1 if depth > 1 else 0
    parent_list = torch.tensor([r[0] for r in rows], dtype=torch.long).view(bs, width)
    seq_lens = torch.randint(0, 6, (bs,), generator=g)
    size = bs * dtn * dtn + (int(seq_lens.sum()) * dtn if mode == 0 else 0)
    return {
        "parent_list": parent_list,
        "selected_index": torch.tensor([r[1] for r in rows], dtype=torch.long).view(bs, dtn - 1),
        "seq_lens": seq_lens,
        "tree_mask": torch.randint(0, 2, (size + 3,), generator=g).bool(),  # + tail the op must not touch
        "positions": torch.randint(100, 200, (bs * dtn,), generator=g),
        "retrieve": torch.full((3, bs, dtn), -1, dtype=torch.long),
        "topk": topk,
        "depth": depth,
        "dtn": dtn,
        "mode": mode,
    }


def _random_tree(g: torch.Generator, n: int, shape: str) -> list[int]:
    """Parent of each node (node 0 is the root: -1). shape: chain | random | star."""
    if shape == "chain":
        return [-1] + list(range(n - 1))
    if shape == "star":
        return [-1] + [0] * (n - 1)
    return [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]


def _links(parents: list[int]) -> tuple[list[int], list[int]]:
    """First child and next sibling per node, children in ascending order."""
    first, sibling = [-1] * len(parents), [-1] * len(parents)
    for i in range(len(parents) - 1, 0, -1):
        sibling[i] = first[parents[i]]
        first[parents[i]] = i
    return first, sibling


def _tree_depths(parents: list[int]) -> list[int]:
    depths = [0] * len(parents)
    for i in range(1, len(parents)):
        depths[i] = depths[parents[i]] + 1
    return depths


def _verify_case(g: torch.Generator, bs: int, n: int, shape: str, outcome: str = "random") -> dict[str, Any]:
    vocab = 3
    cand, first, sib, target, max_depth = [], [], [], [], 0
    for _ in range(bs):
        parents = _random_tree(g, n, shape)
        f, s = _links(parents)
        c = torch.randint(0, vocab, (n,), generator=g).tolist()
        t = torch.randint(0, vocab, (n,), generator=g).tolist()
        if outcome == "all":  # every node's target is its (last) child's token
            for i in range(1, n):
                t[parents[i]] = c[i]
        elif outcome == "none":
            t = [vocab + 1] * n
        cand.append(c)
        first.append(f)
        sib.append(s)
        target.append(t)
        max_depth = max(max_depth, max(_tree_depths(parents)))
    steps = max_depth + 1 if outcome == "all" else int(torch.randint(1, max_depth + 2, (1,), generator=g))
    return {
        "predicts": torch.randint(-50, -1, (bs * n,), generator=g, dtype=torch.int32),
        "accept_index": torch.randint(-50, -1, (bs, steps), generator=g, dtype=torch.int32),
        "accept_token_num": torch.randint(-50, -1, (bs,), generator=g, dtype=torch.int32),
        "candidates": torch.tensor(cand, dtype=torch.long),
        "retrieve_index": torch.arange(bs * n).view(bs, n),
        "retrieve_next_token": torch.tensor(first, dtype=torch.long),
        "retrieve_next_sibling": torch.tensor(sib, dtype=torch.long),
        "target_predict": torch.tensor(target, dtype=torch.long),
    }


def _table(g: torch.Generator, rows: int, pool_len: int) -> torch.Tensor:
    return torch.randperm(rows * pool_len, generator=g).to(torch.int32).view(rows, pool_len)


def _extend_case(g: torch.Generator, bs: int) -> dict[str, Any]:
    rows, pool_len = bs + 2, 24
    start = torch.randint(0, 12, (bs,), generator=g)
    end = start + torch.randint(0, 8, (bs,), generator=g)
    total = int((end - start).sum())
    return {
        "req_pool_indices": torch.randperm(rows, generator=g)[:bs],
        "req_to_token": _table(g, rows, pool_len),
        "start": start,
        "end": end,
        "out": torch.randint(-99, -1, (total + 4,), generator=g),
    }


def _draft_case(g: torch.Generator, bs: int, topk: int, num_steps: int) -> dict[str, Any]:
    rows, pool_len = bs + 2, 32
    return {
        "req_pool_indices": torch.randperm(rows, generator=g)[:bs],
        "req_to_token": _table(g, rows, pool_len),
        "seq_lens": torch.randint(1, 10, (bs,), generator=g),
        "out": torch.randint(-99, -1, (bs * topk * num_steps,), generator=g),
        "topk": topk,
        "num_steps": num_steps,
    }


def _bonus_case(g: torch.Generator, bs: int, stride: int) -> dict[str, Any]:
    return {
        "accept_tokens": torch.randint(0, 1000, (bs, stride), generator=g, dtype=torch.int32),
        "accept_lens": torch.randint(1, stride + 1, (bs,), generator=g, dtype=torch.int32),
        "bonus": torch.randint(-9, -1, (bs,), generator=g, dtype=torch.int32),
    }


def _accept_case(g: torch.Generator, bs: int, steps: int, dtn: int) -> dict[str, Any]:
    index = torch.full((bs, steps), -1, dtype=torch.int32)
    for b in range(bs):
        k = int(torch.randint(1, steps + 1, (1,), generator=g))
        index[b, :k] = (b * dtn + torch.randperm(dtn, generator=g)[:k]).to(torch.int32)
    return {
        "accept_index": index,
        "out_cache_loc": torch.randperm(bs * dtn + 5, generator=g)[: bs * dtn] + 100,
        "accept_out": torch.randint(-9, -1, (bs * steps,), generator=g),
    }


def _rotate_case(g: torch.Generator, bs: int, with_select: bool) -> dict[str, Any]:
    lens = torch.randint(0, 6, (bs,), generator=g)
    lens[0] = max(int(lens[0]), 1)
    starts = torch.cumsum(lens, 0) - lens
    total = int(lens.sum())
    select = None
    if with_select:  # a slot inside each request's window, as the draft-extend runner passes
        select = starts + (torch.rand(bs, generator=g) * lens).long().clamp(max=(lens - 1).clamp(min=0))
    return {
        "input_ids": torch.randint(0, 1000, (total + 2,), generator=g),
        "start_loc": starts.to(torch.int32),
        "seq_lens": lens,
        "topk_index": torch.randint(1000, 2000, (bs, 1), generator=g),
        "select_index": select,
    }


def _all_cases() -> dict[str, list[dict[str, Any]]]:
    cases: dict[str, list[dict[str, Any]]] = {op: [] for op in ("build", "verify", "extend", "draft")}
    cases.update({op: [] for op in ("kv_indices", "bonus", "accept", "rotate")})
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        topk = 1 + seed % 4
        depth = 1 + (seed // 4) % 4
        n_cand = topk + (depth - 1) * topk * topk
        dtn = min(2 + seed % 7, n_cand + 1)
        bs = 1 + seed % 3
        cases["build"].append(_build_case(g, bs, topk, depth, dtn, mode=seed % 2, closed=seed % 5 != 4))
        shape = ("random", "chain", "star")[seed % 3]
        cases["verify"].append(_verify_case(g, bs, 2 + seed % 7, shape))
    g = torch.Generator().manual_seed(1234)
    cases["build"] += [
        _build_case(g, 1, 1, 4, 5, mode=0),  # topk 1: a chain
        _build_case(g, 2, 4, 1, 5, mode=1),  # one draft step: empty parent_list
        _build_case(g, 2, 2, 3, 7, mode=1, closed=False),
    ]
    cases["verify"] += [
        _verify_case(g, 1, 6, "chain", "all"),
        _verify_case(g, 3, 8, "random", "all"),
        _verify_case(g, 2, 5, "random", "none"),
        _verify_case(g, 1, 1, "chain"),  # root only
    ]
    for bs in (1, 3, 5):
        cases["extend"].append(_extend_case(g, bs))
        cases["bonus"].append(_bonus_case(g, bs, 1 + bs))
        cases["accept"].append(_accept_case(g, bs, 3, 4))
    for bs, topk, steps in ((1, 1, 3), (3, 2, 2), (2, 4, 3)):
        cases["draft"].append(_draft_case(g, bs, topk, steps))
        cases["kv_indices"].append(_draft_case(g, bs, topk, steps))
    for bs, with_select in ((1, False), (4, False), (4, True)):
        cases["rotate"].append(_rotate_case(g, bs, with_select))
    return cases


@pytest.fixture(scope="module")
def triton_reference(tmp_path_factory) -> dict[str, list[tuple[dict[str, Any], dict[str, Any]]]]:
    """Every case paired with what SGLang's Triton kernel (interpreted) left in its buffers."""
    cases = _all_cases()
    tmp = tmp_path_factory.mktemp("spec_ops")
    torch.save(cases, tmp / "in.pt")
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(SPEC_KERNELS), str(tmp / "in.pt"), str(tmp / "out.pt")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"Triton reference run failed:\n{proc.stderr[-4000:]}"
    results = torch.load(tmp / "out.pt")
    return {op: list(zip(items, results[op])) for op, items in cases.items()}


def _assert_same(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.dtype == ref.dtype, f"{what}: dtype {ours.dtype} != {ref.dtype}"
    assert torch.equal(ours, ref), f"{what}:\nours={ours.tolist()}\nref ={ref.tolist()}"


# --- ops with a Triton reference ------------------------------------------------------------------


def test_build_tree_matches_triton(triton_reference):
    assert len(triton_reference["build"]) == len(SEEDS) + 3
    for i, (case, ref) in enumerate(triton_reference["build"]):
        c = _clone(case)
        build_tree_kernel_efficient_cpu(
            c["parent_list"],
            c["selected_index"],
            c["seq_lens"],
            c["tree_mask"],
            c["positions"],
            c["retrieve"][0],
            c["retrieve"][1],
            c["retrieve"][2],
            c["topk"],
            c["depth"],
            c["dtn"],
            c["mode"],
        )
        for key in ("tree_mask", "positions", "retrieve"):
            _assert_same(c[key], ref[key], f"build case {i} {key}")


def test_build_tree_cases_exercise_real_trees(triton_reference):
    # Guards the generator: the comparisons above must cover siblings, depth >= 3 and the
    # missing-parent path, not just trivial trees.
    has_sibling = depth_3 = unlinked = False
    for case, ref in triton_reference["build"]:
        depths = ref["positions"] - case["seq_lens"].repeat_interleave(case["dtn"])
        depth_3 |= int(depths.max()) >= 3
        has_sibling |= bool((ref["retrieve"][2] >= 0).any())
        # every non-root node is somebody's first child or sibling, unless its parent is missing
        linked = int((ref["retrieve"][1] >= 0).sum() + (ref["retrieve"][2] >= 0).sum())
        unlinked |= linked < case["seq_lens"].numel() * (case["dtn"] - 1)
    assert has_sibling and depth_3 and unlinked


def test_verify_tree_greedy_matches_triton(triton_reference):
    accepted = []
    for i, (case, ref) in enumerate(triton_reference["verify"]):
        c = _clone(case)
        verify_tree_greedy_cpu(
            predicts=c["predicts"],
            accept_index=c["accept_index"],
            accept_token_num=c["accept_token_num"],
            candidates=c["candidates"],
            retrive_index=c["retrieve_index"],
            retrive_next_token=c["retrieve_next_token"],
            retrive_next_sibling=c["retrieve_next_sibling"],
            target_predict=c["target_predict"],
        )
        for key in ("predicts", "accept_index", "accept_token_num"):
            _assert_same(c[key], ref[key], f"verify case {i} {key}")
        accepted += ref["accept_token_num"].tolist()
    assert 0 in accepted and max(accepted) >= 4  # both rejections and long accepted paths were compared


def test_verify_all_and_none_accepted_edges(triton_reference):
    *_, all_chain, all_tree, none, root_only = [ref for _, ref in triton_reference["verify"]]
    assert all_chain["accept_token_num"].tolist() == [5]
    assert all_chain["accept_index"].tolist() == [list(range(6))]
    assert none["accept_token_num"].tolist() == [0, 0]
    assert root_only["accept_token_num"].tolist() == [0]
    assert bool((all_tree["accept_token_num"] >= 1).all())


def test_assign_extend_cache_locs_matches_triton(triton_reference):
    for i, (case, ref) in enumerate(triton_reference["extend"]):
        c = _clone(case)
        assign_extend_cache_locs_cpu(
            c["req_pool_indices"], c["req_to_token"], c["start"], c["end"], c["out"], c["req_to_token"].shape[1]
        )
        _assert_same(c["out"], ref["out"], f"extend case {i}")
        assert bool((ref["out"][-4:] < 0).all())  # the tail past the packed rows stays untouched


def test_assign_draft_cache_locs_contiguous_matches_triton(triton_reference):
    for i, (case, ref) in enumerate(triton_reference["draft"]):
        c = _clone(case)
        assign_draft_cache_locs_contiguous_cpu(
            c["req_pool_indices"],
            c["req_to_token"],
            c["seq_lens"],
            c["out"],
            c["req_to_token"].shape[1],
            c["topk"],
            c["num_steps"],
        )
        _assert_same(c["out"], ref["out"], f"draft case {i}")


def test_build_draft_decode_metadata_matches_triton_kv_indices(triton_reference):
    """Row b * topk + t must hold exactly the KV indices the Triton draft-decode backend builds
    for request b, branch t at every draft step (generate_draft_decode_kv_indices, page 1)."""
    for i, (case, ref) in enumerate(triton_reference["kv_indices"]):
        c = _clone(case)
        topk, steps = c["topk"], c["num_steps"]
        table = build_draft_decode_metadata_cpu(
            c["req_to_token"], c["req_pool_indices"], c["seq_lens"], topk, steps, c["req_to_token"].shape[1]
        )
        assert table.shape == (c["seq_lens"].numel() * topk, c["req_to_token"].shape[1])
        assert table.dtype == c["req_to_token"].dtype
        lens = c["seq_lens"].repeat_interleave(topk).tolist()
        for step in range(steps):
            indptr = ref["kv_indptr"][step].tolist()
            for z, seq_len in enumerate(lens):
                segment = ref["kv_indices"][step, indptr[z] : indptr[z + 1]]
                assert segment.numel() == seq_len + step + 1
                assert table[z, : seq_len + step + 1].tolist() == segment.tolist(), f"case {i} step {step} row {z}"


def test_fill_bonus_tokens_matches_triton(triton_reference):
    for i, (case, ref) in enumerate(triton_reference["bonus"]):
        c = _clone(case)
        fill_bonus_tokens_cpu(c["accept_tokens"], c["accept_lens"], c["bonus"], c["accept_tokens"].shape[1])
        _assert_same(c["bonus"], ref["bonus"], f"bonus case {i}")


def test_fill_accept_out_cache_loc_matches_triton(triton_reference):
    for i, (case, ref) in enumerate(triton_reference["accept"]):
        c = _clone(case)
        fill_accept_out_cache_loc_cpu(c["accept_index"], c["out_cache_loc"], c["accept_out"])
        _assert_same(c["accept_out"], ref["accept_out"], f"accept case {i}")
        c = _clone(case)  # the 4-argument form of newer sgl_kernel builds
        fill_accept_out_cache_loc_cpu(
            c["accept_index"], c["out_cache_loc"], c["accept_out"], case["accept_index"].numel()
        )
        _assert_same(c["accept_out"], ref["accept_out"], f"accept case {i} (size given)")


def test_rotate_input_ids_matches_triton(triton_reference):
    for i, (case, ref) in enumerate(triton_reference["rotate"]):
        c = _clone(case)
        rotate_input_ids_cpu(c["input_ids"], c["start_loc"], c["seq_lens"], c["topk_index"], c["select_index"])
        _assert_same(c["input_ids"], ref["input_ids"], f"rotate case {i}")
        assert not torch.equal(ref["input_ids"], case["input_ids"])


# --- hand-checked behaviour -----------------------------------------------------------------------


# What SGLang 0.5.17's CPU speculation path imports from sgl_kernel (eagle_utils, spec_utils,
# eagle_worker_common, intel_amx_backend, ngram_worker, multi_layer_eagle_worker_v2).
SGLANG_CPU_SPEC_IMPORTS = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "build_draft_decode_metadata_cpu",
)


def test_spec_ops_cover_every_op_sglang_imports():
    assert set(SGLANG_CPU_SPEC_IMPORTS) <= set(SPEC_OPS)
    assert "reconstruct_indices_from_tree_mask" in SPEC_OPS
    assert all(fn.__name__ == name for name, fn in SPEC_OPS.items())


def test_build_tree_hand_example_qlen_only():
    # topk 2, 2 steps. Candidates 0, 1 hang off the root; 2..5 are children of candidate 0
    # (block 0) and of candidate 1 (block 1). Selected: 0, 1, 3, 4 -> nodes 1..4, with node 3
    # (candidate 3) under node 1 and node 4 (candidate 4) under node 2.
    parent_list = torch.tensor([[-1, 0, 1]])
    selected = torch.tensor([[0, 1, 3, 4]])
    seq_lens = torch.tensor([7])
    mask = torch.zeros(25, dtype=torch.bool)
    positions = torch.zeros(5, dtype=torch.long)
    links = torch.full((3, 1, 5), -1, dtype=torch.long)
    build_tree_kernel_efficient_cpu(parent_list, selected, seq_lens, mask, positions, *links, 2, 2, 5, 1)
    assert positions.tolist() == [7, 8, 8, 9, 9]
    assert links[0].tolist() == [[0, 1, 2, 3, 4]]
    assert links[1].tolist() == [[1, 3, 4, -1, -1]]  # first child
    assert links[2].tolist() == [[-1, 2, -1, -1, -1]]  # next sibling
    assert mask.view(5, 5).int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [1, 1, 0, 1, 0],
        [1, 0, 1, 0, 1],
    ]


def test_build_tree_full_mask_leaves_prefix_columns_alone():
    parent_list = torch.tensor([[-1, 0], [-1, 0]])
    selected = torch.tensor([[0, 1], [0, 1]])  # topk 1, 2 steps: a chain of three
    seq_lens = torch.tensor([2, 1])
    mask = torch.ones((2 + 3) * 3 + (1 + 3) * 3, dtype=torch.bool)
    build_tree_kernel_efficient_cpu(
        parent_list, selected, seq_lens, mask, torch.zeros(6, dtype=torch.long), *torch.full((3, 2, 3), -1), 1, 2, 3, 0
    )
    chain = [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    first = mask[:15].view(3, 5)
    second = mask[15:].view(3, 4)
    assert first[:, :2].all() and second[:, :1].all()
    assert first[:, 2:].int().tolist() == chain and second[:, 1:].int().tolist() == chain


def test_build_tree_rejects_bitpacked_mask():
    with pytest.raises(NotImplementedError):
        build_tree_kernel_efficient_cpu(
            torch.tensor([[-1, 0]]),
            torch.tensor([[0]]),
            torch.tensor([3]),
            torch.zeros(2, dtype=torch.uint8),
            torch.zeros(2, dtype=torch.long),
            *torch.full((3, 1, 2), -1),
            1,
            1,
            2,
            2,
        )


def test_verify_hand_example_first_matching_sibling_wins():
    # Root 0 with children 1, 2 (both token 5); node 1 has child 3 (token 6).
    candidates = torch.tensor([[9, 5, 5, 6]])
    first, sibling = _links([-1, 0, 0, 1])
    target = torch.tensor([[5, 6, 8, 7]])  # root -> 5, node 1 -> 6, node 3 -> 7 (bonus)
    predicts = torch.zeros(4, dtype=torch.int32)
    accept_index = torch.full((1, 3), -1, dtype=torch.int32)
    count = torch.zeros(1, dtype=torch.int32)
    links = (torch.arange(4).view(1, 4), torch.tensor([first]), torch.tensor([sibling]))
    verify_tree_greedy_cpu(predicts, accept_index, count, candidates, *links, target)
    assert accept_index.tolist() == [[0, 1, 3]]
    assert count.tolist() == [2]
    assert predicts.tolist() == [5, 6, 0, 7]


def _ngram_mask(parents: list[list[int]]) -> torch.Tensor:
    """NGRAM's layout: mask[b, i, j] = j is i itself or one of its ancestors."""
    n = len(parents[0])
    mask = torch.zeros((len(parents), n, n), dtype=torch.bool)
    for b, row in enumerate(parents):
        for i in range(n):
            j = i
            while j >= 0:
                mask[b, i, j] = True
                j = row[j]
    return mask


def _load_sglang_derive_tree_links():
    """SGLang's own host-side mirror of reconstruct_indices_from_tree_mask's links
    (ngram_worker._derive_tree_links), exec'd alone: importing ngram_worker needs the
    sgl_kernel.speculative module this op is for."""
    path = SGLANG_ROOT / "srt" / "speculative" / "ngram_worker.py"
    tree = ast.parse(path.read_text(), str(path))
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_derive_tree_links"]
    if not body:
        pytest.skip("this SGLang has no ngram_worker._derive_tree_links")
    namespace: dict[str, Any] = {"np": np, "torch": torch}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(path), "exec"), namespace)
    return namespace["_derive_tree_links"]


def test_reconstruct_indices_matches_sglang_host_links_and_depths():
    derive = _load_sglang_derive_tree_links()
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        bs, n = 1 + seed % 3, 1 + seed % 8
        parents = [_random_tree(g, n, ("random", "chain", "star")[(seed + b) % 3]) for b in range(bs)]
        mask = _ngram_mask(parents)
        seq_lens = torch.randint(0, 50, (bs,), generator=g)
        out = torch.randint(-9, 9, (4, bs, n), generator=g)
        positions = out[0].reshape(-1)
        reconstruct_indices_from_tree_mask(mask.reshape(-1), seq_lens, positions, out[1], out[2], out[3], bs, n)
        want_next, want_sibling = derive(mask.reshape(-1).numpy(), bs, n)
        assert out[2].tolist() == want_next.tolist(), f"seed {seed} next_token"
        assert out[3].tolist() == want_sibling.tolist(), f"seed {seed} next_sibling"
        depths = [[seq_lens[b].item() + d for d in _tree_depths(parents[b])] for b in range(bs)]
        assert out[0].tolist() == depths, f"seed {seed} positions"
        assert out[1].tolist() == torch.arange(bs * n).view(bs, n).tolist()
        first, sibling = zip(*(_links(p) for p in parents))
        assert out[2].tolist() == [list(f) for f in first] and out[3].tolist() == [list(s) for s in sibling]


def test_reconstruct_indices_hand_example():
    # 0 -> {1, 3}, 1 -> {2}; positions follow depth from a 10-token prefix.
    mask = _ngram_mask([[-1, 0, 1, 0]])
    out = torch.zeros((4, 1, 4), dtype=torch.long)
    reconstruct_indices_from_tree_mask(mask.view(-1), torch.tensor([10]), out[0].view(-1), out[1], out[2], out[3], 1, 4)
    assert out[0].tolist() == [[10, 11, 12, 11]]
    assert out[2].tolist() == [[1, 2, -1, -1]]
    assert out[3].tolist() == [[-1, 3, -1, -1]]


def test_rotate_input_ids_hand_example():
    ids = torch.tensor([1, 2, 3, 4, 5, 6])
    rotate_input_ids_cpu(ids, torch.tensor([0, 3, 3]), torch.tensor([3, 0, 3]), torch.tensor([[70], [80], [90]]))
    assert ids.tolist() == [2, 3, 70, 5, 6, 90]  # the empty window (request 1) is skipped


def test_fill_accept_out_cache_loc_compacts_in_order():
    accept_index = torch.tensor([[2, 0, -1], [5, -1, -1]], dtype=torch.int32)
    out_cache_loc = torch.tensor([10, 11, 12, 13, 14, 15])
    dst = torch.full((6,), -3)
    fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dst)
    assert dst.tolist() == [12, 10, 15, -3, -3, -3]


def test_cache_loc_ops_reject_wrong_pool_len():
    table = torch.zeros((2, 8), dtype=torch.int32)
    with pytest.raises(ValueError):
        assign_extend_cache_locs_cpu(
            torch.tensor([0]), table, torch.tensor([0]), torch.tensor([1]), torch.zeros(1, dtype=torch.long), 9
        )
    with pytest.raises(ValueError):
        build_draft_decode_metadata_cpu(table, torch.tensor([0]), torch.tensor([1]), 1, 1, 4)
