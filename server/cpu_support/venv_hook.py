"""Install the CPU import hooks into a virtualenv with a .pth file, so any interpreter of that
venv (test clients, `python -m sglang.bench_serving`, frontend programs) gets them."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_slo_cpu.pth"
PTH_LINE = "import server.cpu_support as _slo_cpu; _slo_cpu.activate()\n"


def install_pth(site_packages: Path | None = None) -> Path:
    target = Path(site_packages or sysconfig.get_paths()["purelib"]) / PTH_NAME
    target.write_text(PTH_LINE)
    return target


if __name__ == "__main__":
    print(install_pth(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
