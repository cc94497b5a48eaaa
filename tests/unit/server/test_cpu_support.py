"""The CPU stand-in for sgl_kernel (its two real ops against naive references, stubs and
missing names) and the import finder that serves it only when no real sgl_kernel exists."""

from __future__ import annotations

import importlib
import importlib.util
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from server.cpu_support import import_hooks
from server.cpu_support.import_hooks import SUBSTITUTE_NAME, _CpuImportFinder, install_import_hooks
from server.cpu_support.sgl_kernel_substitute import (
    IMPLEMENTED,
    assign_req_to_token_pool_cpu,
    copy_all_layer_kv_cache_cpu,
    make_module,
    make_submodule,
)

FAST = settings(max_examples=60, deadline=None)


# --- assign_req_to_token_pool_cpu -----------------------------------------------------------------


@st.composite
def assign_cases(draw):
    pool_rows = draw(st.integers(1, 8))
    width = draw(st.integers(1, 24))
    n_req = draw(st.integers(0, pool_rows))
    rows = draw(st.permutations(range(pool_rows)))[:n_req]
    starts, ends = [], []
    for _ in rows:
        a = draw(st.integers(0, width))
        b = draw(st.integers(a, width))
        starts.append(a)
        ends.append(b)
    total = sum(e - s for s, e in zip(starts, ends))
    out = draw(st.lists(st.integers(0, 2**31 - 1), min_size=total, max_size=total))
    init = draw(st.lists(st.integers(-5, 5), min_size=pool_rows * width, max_size=pool_rows * width))
    return pool_rows, width, rows, starts, ends, out, init


@FAST
@given(assign_cases())
def test_assign_req_to_token_pool_matches_naive_reference(case):
    pool_rows, width, rows, starts, ends, out, init = case
    table = torch.tensor(init, dtype=torch.int32).view(pool_rows, width)
    expected = [init[r * width : (r + 1) * width] for r in range(pool_rows)]
    k = 0
    for row, s, e in zip(rows, starts, ends):
        for col in range(s, e):
            expected[row][col] = out[k]
            k += 1
    assign_req_to_token_pool_cpu(
        torch.tensor(rows, dtype=torch.int64),
        table,
        torch.tensor(starts, dtype=torch.int64),
        torch.tensor(ends, dtype=torch.int64),
        torch.tensor(out, dtype=torch.int64),
        width,
    )
    assert table.dtype == torch.int32
    assert table.tolist() == expected


def test_assign_req_to_token_pool_worked_example():
    table = torch.full((3, 6), -1, dtype=torch.int32)
    assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),
        table,
        torch.tensor([1, 4]),
        torch.tensor([3, 6]),
        torch.tensor([10, 11, 20, 21]),
        6,
    )
    assert table.tolist() == [
        [-1, -1, -1, -1, 20, 21],
        [-1] * 6,
        [-1, 10, 11, -1, -1, -1],
    ]


# --- copy_all_layer_kv_cache_cpu ------------------------------------------------------------------


def _layers(num_rows, seed):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randn(num_rows, 2, 4, generator=g, dtype=torch.float32),
        torch.randn(num_rows, 3, generator=g).to(torch.bfloat16),
        torch.randint(0, 255, (num_rows, 5), generator=g, dtype=torch.uint8),
        torch.randn(num_rows, 1, 8, generator=g, dtype=torch.float16),
    ]


def _ptrs_and_strides(bufs):
    ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.int64)
    strides = torch.tensor([b[0].numel() * b.element_size() for b in bufs], dtype=torch.int64)
    return ptrs, strides


def _expected_copy(bufs, src, tgt):
    out = [b.clone() for b in bufs]
    for e, b in zip(out, bufs):
        for s, t in zip(src, tgt):
            e[t] = b[s]  # read from the original: all reads happen before any write
    return out


def test_copy_all_layers_rows_copied_others_untouched():
    bufs = _layers(16, seed=0)
    before = [b.clone() for b in bufs]
    src, tgt = [1, 3, 5], [9, 10, 2]
    ptrs, strides = _ptrs_and_strides(bufs)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor(tgt), torch.tensor(src))
    for b, old in zip(bufs, before):
        for s, t in zip(src, tgt):
            assert torch.equal(b[t], old[s])
        untouched = [r for r in range(16) if r not in tgt]
        assert torch.equal(b[untouched], old[untouched])


def test_copy_swap_reads_before_writes():
    bufs = _layers(4, seed=1)
    expected = _expected_copy(bufs, [1, 2], [2, 1])
    ptrs, strides = _ptrs_and_strides(bufs)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([2, 1], dtype=torch.int32), torch.tensor([1, 2]))
    for b, e in zip(bufs, expected):
        assert torch.equal(b, e)


def test_copy_empty_is_noop():
    bufs = _layers(4, seed=2)
    before = [b.clone() for b in bufs]
    ptrs, strides = _ptrs_and_strides(bufs)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64))
    assert all(torch.equal(b, o) for b, o in zip(bufs, before))


@FAST
@given(
    num_rows=st.integers(2, 20),
    data=st.data(),
    seed=st.integers(0, 10_000),
)
def test_copy_matches_reference_property(num_rows, data, seed):
    n = data.draw(st.integers(1, num_rows))
    tgt = data.draw(st.permutations(range(num_rows)))[:n]  # distinct targets
    src = data.draw(st.lists(st.integers(0, num_rows - 1), min_size=n, max_size=n))
    bufs = _layers(num_rows, seed)
    expected = _expected_copy(bufs, src, tgt)
    ptrs, strides = _ptrs_and_strides(bufs)
    copy_all_layer_kv_cache_cpu(ptrs, strides, torch.tensor(tgt), torch.tensor(src))
    for b, e in zip(bufs, expected):
        assert torch.equal(b, e)


# --- the substitute module ------------------------------------------------------------------------


def test_module_exposes_implemented_ops():
    mod = make_module()
    assert mod.__name__ == "sgl_kernel"
    assert "cpu" in mod.__version__
    for name, fn in IMPLEMENTED.items():
        assert getattr(mod, name) is fn
    # the intel_amx backend reads its attention ops from torch.ops after importing sgl_kernel
    assert callable(torch.ops.sgl_kernel.decode_attention_cpu)
    assert callable(torch.ops.sgl_kernel.extend_attention_cpu)


def test_speculative_submodule_serves_ngram_op_and_nothing_else():
    sub = make_submodule("speculative")
    assert sub.__name__ == "sgl_kernel.speculative"
    assert sub.reconstruct_indices_from_tree_mask is IMPLEMENTED["reconstruct_indices_from_tree_mask"]
    assert make_submodule("mamba") is None


@pytest.mark.parametrize("name", ["merge_state_v2", "fused_add_rmsnorm", "silu_and_mul_cpu"])
def test_unimplemented_name_is_attribute_error_naming_it(name):
    mod = make_module()
    with pytest.raises(AttributeError, match=rf"sgl_kernel\.{name}\b"):
        getattr(mod, name)
    assert not hasattr(mod, name)


def test_unimplemented_name_is_import_error_for_from_import(monkeypatch):
    monkeypatch.setitem(sys.modules, "sgl_kernel", make_module())
    with pytest.raises(ImportError, match="flash_ops_xyz"):
        exec("from sgl_kernel import flash_ops_xyz", {})
    namespace: dict = {}
    exec("from sgl_kernel import assign_req_to_token_pool_cpu", namespace)
    assert namespace["assign_req_to_token_pool_cpu"] is assign_req_to_token_pool_cpu


def test_dunder_lookups_fail_plainly():
    mod = make_module()
    with pytest.raises(AttributeError) as info:
        mod.__wrapped__  # noqa: B018
    assert "substitute" not in str(info.value)


# --- the import finder ----------------------------------------------------------------------------


def _fake_real_sgl_kernel(tmp_path):
    pkg = tmp_path / SUBSTITUTE_NAME
    pkg.mkdir()
    (pkg / "__init__.py").write_text("REAL = True\n")
    return pkg


def test_finder_steps_aside_for_a_real_sgl_kernel(tmp_path, monkeypatch):
    _fake_real_sgl_kernel(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _CpuImportFinder().find_spec(SUBSTITUTE_NAME) is None


def test_real_sgl_kernel_is_imported_instead_of_substitute(tmp_path, monkeypatch):
    pkg = _fake_real_sgl_kernel(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    finder = _CpuImportFinder()
    others = [f for f in sys.meta_path if not isinstance(f, _CpuImportFinder)]
    monkeypatch.setattr(sys, "meta_path", [finder, *others])
    monkeypatch.delitem(sys.modules, SUBSTITUTE_NAME, raising=False)
    mod = importlib.import_module(SUBSTITUTE_NAME)
    try:
        assert getattr(mod, "REAL", False) is True
        assert str(pkg) in mod.__file__
    finally:
        sys.modules.pop(SUBSTITUTE_NAME, None)


def test_finder_serves_substitute_when_none_exists(monkeypatch):
    assert importlib.machinery.PathFinder.find_spec(SUBSTITUTE_NAME) is None, "a real sgl_kernel is installed"
    finder = _CpuImportFinder()
    spec = finder.find_spec(SUBSTITUTE_NAME)
    assert spec is not None
    assert spec.name == SUBSTITUTE_NAME
    assert spec.submodule_search_locations == []
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.assign_req_to_token_pool_cpu is assign_req_to_token_pool_cpu


def test_substitute_import_end_to_end_without_submodules(monkeypatch):
    finder = _CpuImportFinder()
    others = [f for f in sys.meta_path if not isinstance(f, _CpuImportFinder)]
    monkeypatch.setattr(sys, "meta_path", [finder, *others])
    saved = {k: v for k, v in sys.modules.items() if k == SUBSTITUTE_NAME or k.startswith(SUBSTITUTE_NAME + ".")}
    for k in saved:
        monkeypatch.delitem(sys.modules, k)
    try:
        mod = importlib.import_module(SUBSTITUTE_NAME)
        assert mod.copy_all_layer_kv_cache_cpu is copy_all_layer_kv_cache_cpu
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module("sgl_kernel.mamba")
        spec_mod = importlib.import_module("sgl_kernel.speculative")
        assert spec_mod.reconstruct_indices_from_tree_mask is IMPLEMENTED["reconstruct_indices_from_tree_mask"]
    finally:
        for k in [k for k in sys.modules if k == SUBSTITUTE_NAME or k.startswith(SUBSTITUTE_NAME + ".")]:
            sys.modules.pop(k)


@pytest.mark.parametrize("name", ["sgl_kernel.mamba", "sgl_kernel.flash_attn", "sgl_kernel_extras", "os", "torch"])
def test_finder_ignores_other_names(name):
    assert _CpuImportFinder().find_spec(name) is None


def test_finder_guards_torchvision_once(monkeypatch):
    calls = []
    monkeypatch.setattr(import_hooks, "_guard_torchvision", lambda: calls.append(1))
    finder = _CpuImportFinder()
    assert finder.find_spec("torchvision") is None
    assert finder.find_spec("torchvision") is None
    assert calls == [1]
    assert finder.find_spec("torchvision.ops") is None
    assert calls == [1]


def test_install_import_hooks_idempotent(monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [f for f in sys.meta_path if f is not import_hooks._FINDER])
    install_import_hooks()
    install_import_hooks()
    assert sys.meta_path.count(import_hooks._FINDER) == 1
    assert sys.meta_path[0] is import_hooks._FINDER
