"""Start a real server for a benchmark on 127.0.0.1 and always stop it by PID.

`python -m launch_server` (sglang-slo) or, with `stock=True`, `python -m sglang.launch_server`
with the CPU flags launch_server would apply (launch/launch_server.py CPU_DEFAULTS) and
SGLANG_USE_CPU_ENGINE=1. Each server runs in its own process group; stopping it sends SIGTERM
to the group, then SIGKILL, and kills any child that survives. Every started server is
registered, so `stop_all()` (called from an atexit hook and a SIGTERM handler installed by
`install_signal_handlers()`) stops whatever is left after Ctrl-C or a failure.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import requests

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT, ROOT / "launch"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

READY_TIMEOUT_S = 300.0
_LIVE: set[BenchServer] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


class BenchServer:
    def __init__(self, model_path: str, args: list[str], *, stock: bool = False, name: str = "server") -> None:
        self.stock = stock
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ)
        if stock:
            from launch_server import _with_cpu_defaults

            argv = ["--model-path", resolve_model(model_path), *args]
            if on_cpu():
                argv = _with_cpu_defaults(argv)
                self.env["SGLANG_USE_CPU_ENGINE"] = "1"
            self.cmd = [sys.executable, "-m", "sglang.launch_server", *argv]
        else:
            self.cmd = [sys.executable, "-m", "launch_server", "--model-path", model_path, *args]
        self.cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = Path(tempfile.mkstemp(prefix=f"slo-mix-{name}-", suffix=".log")[1])
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def start(self) -> BenchServer:
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=self.env, cwd=ROOT
            )
        _LIVE.add(self)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"server not ready after {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 6000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(line for line in text.splitlines() if "_pytree.py" not in line)[-chars:]

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        pid = proc.pid
        try:
            family = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
        for child in family:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=10)

    def __enter__(self) -> BenchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
