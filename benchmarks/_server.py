"""Start a real server for a benchmark on 127.0.0.1 and always stop it by PID.

`python -m launch_server` (sglang-slo) or, with `stock=True`, `python -m sglang.launch_server`
with the CPU flags launch_server would apply (launch/launch_server.py CPU_DEFAULTS) and
SGLANG_USE_CPU_ENGINE=1; process handling is server.process.ServerProcess. Every started
server is registered, so `stop_all()` (called from an atexit hook and a SIGTERM handler
installed by `install_signal_handlers()`) stops whatever is left after Ctrl-C or a failure.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "launch"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from benchmarks.cli import run_header  # noqa: E402
from server.process import ServerProcess  # noqa: E402

_LIVE: set[BenchServer] = set()


def resolve_model(model_path: str) -> str:
    """'default' / 'tiny' to the prepared HF folder (stock SGLang does not know the aliases)."""
    from server.models import ensure_default_model, ensure_tiny_model

    if model_path == "default":
        return str(ensure_default_model())
    if model_path == "tiny":
        return str(ensure_tiny_model())
    return model_path


def on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class BenchServer(ServerProcess):
    """Our server, or with `stock=True` stock SGLang with the CPU flags launch_server applies;
    every started server is registered so `stop_all()` can stop what a crash left behind."""

    def __init__(self, model_path: str, args: list[str], *, stock: bool = False, name: str = "server") -> None:
        env = dict(os.environ)
        if stock:
            from launch_server import _with_cpu_defaults

            argv = ["--model-path", resolve_model(model_path), *args]
            if on_cpu():
                argv = _with_cpu_defaults(argv)
                env["SGLANG_USE_CPU_ENGINE"] = "1"
            super().__init__(*argv, name=name, module="sglang.launch_server", env=env, cwd=ROOT)
        else:
            super().__init__("--model-path", model_path, *args, name=name, env=env, cwd=ROOT)
        self.stock = stock

    def start(self) -> BenchServer:
        _LIVE.add(self)
        return super().start()

    def stop(self) -> None:
        _LIVE.discard(self)
        super().stop()


def stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


def install_signal_handlers() -> None:
    """SIGTERM/SIGHUP become SystemExit so `finally` blocks run; atexit stops any survivor."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)
    atexit.register(stop_all)


@contextlib.contextmanager
def live_run(args: argparse.Namespace, *, cores: bool = False) -> Iterator[dict[str, Any]]:
    """A benchmark run that starts servers: a signal stops them, and the run's record (headed by
    `run_header`, filled in by the caller) goes to `args.json` even when the run fails part way,
    so what was measured before the failure is kept."""
    install_signal_handlers()
    out = run_header(args, cores=cores)
    try:
        yield out
    finally:
        stop_all()
        if args.json:
            args.json.write_text(json.dumps(out, indent=2))


def export_paths() -> None:
    """Router and workers are `python -m` children: give them launch/ and the root on their path,
    so `launch_router` resolves however this benchmark was started."""
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "launch"), str(ROOT), *([old] if old else [])])


def prepare_live_cluster() -> None:
    """Before a benchmark starts a router and workers: a signal stops every server it started
    (`install_signal_handlers`), and its `python -m` children find our packages (`export_paths`)."""
    install_signal_handlers()
    export_paths()
