"""Import-time fixes for CPU machines: a substitute `sgl_kernel` and a torchvision guard.

Both are meta-path finders, so they cost nothing until the module is imported and step aside
when the real thing works (a real `sgl_kernel` install, a torchvision whose C extension loads).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SUBSTITUTE_NAME = "sgl_kernel"


class _SubstituteLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        from server.cpu_support.sgl_kernel_substitute import make_module

        return make_module()

    def exec_module(self, module: ModuleType) -> None:
        return None


class _CpuImportFinder(importlib.abc.MetaPathFinder):
    """Serves `sgl_kernel` when no real one exists; guards `torchvision` before it loads."""

    def __init__(self) -> None:
        self._real_sgl_kernel: bool | None = None
        self._torchvision_guarded = False

    def find_spec(self, fullname: str, path=None, target=None):  # noqa: ANN001
        if fullname == "torchvision" and not self._torchvision_guarded:
            self._torchvision_guarded = True
            _guard_torchvision()
            return None
        if fullname != SUBSTITUTE_NAME:
            return None  # submodules (sgl_kernel.mamba, ...) stay missing: SGLang falls back
        if self._real_sgl_kernel is None:
            self._real_sgl_kernel = importlib.machinery.PathFinder.find_spec(SUBSTITUTE_NAME) is not None
        if self._real_sgl_kernel:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _SubstituteLoader(), is_package=True)
        spec.submodule_search_locations = []
        return spec


def _guard_torchvision() -> None:
    """PyPI's torchvision is a CUDA build whose C extension cannot load next to CPU torch; its
    fake-op registrations for nms/qnms then crash `import torchvision` (which transformers
    needs). Declaring those two op schemas first lets it import; calling them still fails."""
    spec = importlib.machinery.PathFinder.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return
    import torch

    lib_dir = Path(next(iter(spec.submodule_search_locations)))
    for candidate in sorted(lib_dir.glob("_C*.so")):
        try:
            torch.ops.load_library(str(candidate))
            return  # the real extension works: nothing to guard
        except (OSError, RuntimeError):
            continue
    global _TORCHVISION_LIB
    _TORCHVISION_LIB = torch.library.Library("torchvision", "FRAGMENT")
    for op in ("nms", "qnms"):
        try:
            _TORCHVISION_LIB.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        except RuntimeError:
            pass  # already declared by someone else


_TORCHVISION_LIB = None
_FINDER = _CpuImportFinder()


def install_import_hooks() -> None:
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
