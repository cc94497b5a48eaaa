"""Install the CPU import hooks into a virtualenv with a .pth file, so any interpreter of that
venv (test clients, `python -m sglang.bench_serving`, frontend programs) gets them."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_slo_cpu.pth"
PTH_LINE = "import server.cpu_support as _slo_cpu; _slo_cpu.activate()\n"


def _target(site_packages: Path | None) -> Path:
    return Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME


def install_pth(site_packages: Path | None = None) -> Path:
    target = _target(site_packages)
    target.write_text(PTH_LINE)
    return target


def installed_pth(site_packages: Path | None = None) -> Path | None:
    """The hook's file when this venv has it (a GPU machine must not: it forces the CPU engine)."""
    target = _target(site_packages)
    return target if target.exists() else None


def remove_pth(site_packages: Path | None = None) -> Path | None:
    """Remove the hook (set-up on a GPU machine after a CPU one); the removed file, if there was one."""
    target = installed_pth(site_packages)
    if target is not None:
        target.unlink()
    return target


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--remove"]:
        removed = remove_pth(Path(args[1]) if len(args) > 1 else None)
        print(f"removed {removed}" if removed else "no CPU import hook installed")
    else:
        print(install_pth(Path(args[0]) if args else None))
