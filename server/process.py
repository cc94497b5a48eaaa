"""Start a real server on 127.0.0.1 as a subprocess and always stop it by PID.

Used by the integration tests and the benchmarks. The server runs in its own process group,
so stopping the group also ends SGLang's scheduler and detokenizer children; any survivor
found through psutil is killed too.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

READY_TIMEOUT_S = float(os.environ.get("SGLANG_SLO_TEST_READY_TIMEOUT", "300"))
PORT_RETRIES = 2  # a picked port can be taken (by any process's outgoing connection) before we bind
PORT_TAKEN = "address already in use"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(
        self,
        *args: str,
        name: str = "server",
        module: str = "launch_server",
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        port: int | None = None,
        ready_path: str = "/health",
        api_key: str | None = None,
    ) -> None:
        self.base_args = list(args)
        self._set_port(port or free_port())
        self.module = module
        self.env = env
        self.cwd = cwd
        self.log_path = Path(tempfile.mkstemp(prefix=f"sglang-slo-{name}-", suffix=".log")[1])
        self.ready_path = ready_path
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.proc: subprocess.Popen | None = None
        self.startup_s: float | None = None

    def _set_port(self, port: int) -> None:
        self.port = port
        self.args = [*self.base_args, "--host", "127.0.0.1", "--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> ServerProcess:
        """Start and wait until ready; a server whose HTTP port was taken meanwhile is started
        again on a fresh port (`url` and `port` follow)."""
        for attempt in range(PORT_RETRIES + 1):
            try:
                return self._start_once()
            except RuntimeError as exc:
                if attempt == PORT_RETRIES or PORT_TAKEN not in str(exc) or f"{self.port})" not in str(exc):
                    raise
            self._set_port(free_port())
        raise AssertionError("unreachable")

    def _start_once(self) -> ServerProcess:
        started = time.monotonic()
        env = dict(self.env if self.env is not None else os.environ)
        # On SIGTERM SGLang's tokenizer manager finds its scheduler gone and, for these
        # crash diagnostics (read via sglang.srt.environ.envs), sleeps 5 s before finding
        # nothing to dump; every stop paid it. An explicit setting still wins.
        env.setdefault("SGLANG_PYSPY_DUMP_BEFORE_CRASH", "0")
        env.setdefault("SGLANG_CUDA_COREDUMP_BEFORE_CRASH", "0")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=env,
                cwd=self.cwd,
            )
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
            if self._port_taken():  # uvicorn gave up, but SGLang's other processes may linger
                raise RuntimeError(f"port {self.port} taken:\n{self.log_tail()}")
            try:
                if requests.get(self.url + self.ready_path, headers=self.headers, timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.1)  # ready is noticed within 0.1 s; a refused /health costs next to nothing
        raise TimeoutError(f"server not ready after {READY_TIMEOUT_S} s:\n{self.log_tail()}")

    def _port_taken(self) -> bool:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        return f"{self.port}): {PORT_TAKEN}" in text

    def status_when(self, ok: Callable[[dict], bool], timeout: float = 5.0) -> dict:
        """/slo/status once `ok` holds (the scheduler publishes its part periodically)."""
        deadline = time.monotonic() + timeout
        while True:
            status = requests.get(self.url + "/slo/status", headers=self.headers, timeout=5).json()
            if ok(status) or time.monotonic() > deadline:
                return status
            time.sleep(0.1)

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(line for line in text if "_pytree.py" not in line)[-8000:] if text else ""

    def stop(self) -> None:
        if self.proc is None:
            return
        pid = self.proc.pid
        try:
            family = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)
        for child in family:
            try:
                child.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(family, timeout=10)
        self.proc = None

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
