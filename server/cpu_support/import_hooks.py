"""Import-time fixes for CPU machines: a substitute `sgl_kernel`, a torchvision guard, a
pure-Python `mooncake.engine` where Mooncake's native engine cannot load (PD disaggregation), and
fixes applied to an SGLang module right after it loads (server/cpu_support/pd_transfer.py).

All are meta-path finders, so they cost nothing until the module is imported and step aside
when the real thing works (a real `sgl_kernel` install, a torchvision whose C extension loads).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

SUBSTITUTE_NAME = "sgl_kernel"
MOONCAKE, MOONCAKE_ENGINE = "mooncake", "mooncake.engine"
PATCHED_PREFIX = "sglang.srt.disaggregation."  # where the modules fixed after loading live


class _SubstituteLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        from server.cpu_support.sgl_kernel_substitute import make_module

        return make_module()

    def exec_module(self, module: ModuleType) -> None:
        return None


class _SubmoduleLoader(importlib.abc.Loader):
    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        from server.cpu_support.sgl_kernel_substitute import make_submodule

        return make_submodule(spec.name.split(".", 1)[1])  # type: ignore[return-value]

    def exec_module(self, module: ModuleType) -> None:
        return None


class _ModuleLoader(importlib.abc.Loader):
    """Serves a module built by a function (`make` returns the module's attributes)."""

    def __init__(self, make: object) -> None:
        self.make = make

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = ModuleType(spec.name)
        module.__dict__.update(self.make())  # type: ignore[operator]
        return module

    def exec_module(self, module: ModuleType) -> None:
        return None


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then `patch` on the loaded module; everything else is the real one's."""

    def __init__(self, real: importlib.abc.Loader, patch: Callable[[ModuleType], None]) -> None:
        self.real, self.patch = real, patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.real.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.real.exec_module(module)
        self.patch(module)

    def __getattr__(self, name: str) -> object:  # get_source, get_code, ... (tracebacks, inspect)
        return getattr(self.real, name)


def _patched_spec(fullname: str, path: object) -> importlib.machinery.ModuleSpec | None:
    """The module's own spec with a loader that applies our fix after it runs; None: not ours."""
    from server.cpu_support.pd_transfer import AFTER_IMPORT

    patch = AFTER_IMPORT.get(fullname)
    spec = importlib.machinery.PathFinder.find_spec(fullname, path) if patch else None  # type: ignore[arg-type]
    if patch is None or spec is None or spec.loader is None:
        return None
    spec.loader = _PatchingLoader(spec.loader, patch)
    return spec


def _python_engine() -> dict[str, object]:
    from server.cpu_support.py_transfer_engine import TransferEngine

    return {"TransferEngine": TransferEngine, "__doc__": "sglang-slo's pure-Python Mooncake TransferEngine"}


def _native_loads(spec: importlib.machinery.ModuleSpec | None) -> bool:
    """Whether a native extension's shared libraries resolve (dlopen), without importing it."""
    if spec is None or not spec.origin:
        return False
    import ctypes

    try:
        ctypes.CDLL(spec.origin)
    except OSError:
        return False
    return True


def _mooncake_spec(fullname: str, path: object) -> importlib.machinery.ModuleSpec | None:
    """None (the real module) unless Mooncake's engine cannot load or the Python one is asked for."""
    from server.cpu_support.py_transfer_engine import PYTHON_ENGINE_ENV

    forced = os.environ.get(PYTHON_ENGINE_ENV) == "python"
    if fullname == MOONCAKE:
        if importlib.machinery.PathFinder.find_spec(MOONCAKE) is not None:
            return None
        spec = importlib.machinery.ModuleSpec(fullname, _ModuleLoader(dict), is_package=True)
        spec.submodule_search_locations = []  # an empty package: only our engine lives in it
        return spec
    if not forced and _native_loads(importlib.machinery.PathFinder.find_spec(fullname, path)):  # type: ignore[arg-type]
        return None
    return importlib.machinery.ModuleSpec(fullname, _ModuleLoader(_python_engine))


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
        if fullname in (MOONCAKE, MOONCAKE_ENGINE):
            return _mooncake_spec(fullname, path)
        if fullname.startswith(PATCHED_PREFIX):
            return _patched_spec(fullname, path)
        if fullname != SUBSTITUTE_NAME and not fullname.startswith(SUBSTITUTE_NAME + "."):
            return None
        if self._real_sgl_kernel is None:
            self._real_sgl_kernel = importlib.machinery.PathFinder.find_spec(SUBSTITUTE_NAME) is not None
        if self._real_sgl_kernel:
            return None
        if fullname != SUBSTITUTE_NAME:
            return self._submodule_spec(fullname)
        spec = importlib.machinery.ModuleSpec(fullname, _SubstituteLoader(), is_package=True)
        spec.submodule_search_locations = []
        return spec

    @staticmethod
    def _submodule_spec(fullname: str) -> importlib.machinery.ModuleSpec | None:
        """The few submodules SGLang imports ops from (sgl_kernel.speculative); others stay
        missing so SGLang's fallbacks run."""
        from server.cpu_support.sgl_kernel_substitute import SUBMODULES

        if fullname.split(".", 1)[1] not in SUBMODULES:
            return None
        return importlib.machinery.ModuleSpec(fullname, _SubmoduleLoader())


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
