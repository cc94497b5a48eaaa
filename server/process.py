"""Start a real server on 127.0.0.1 as a subprocess and always stop it by PID; and the child's
side of that promise, `watch_parent`.

Used by the launchers, the integration tests and the benchmarks. The server runs in its own
process group, so stopping the group also ends SGLang's scheduler and detokenizer children; any
survivor found through psutil is killed too. A process this module starts is told its parent's
PID (`PARENT_PID_ENV`); launch_server and launch_router watch it and end their whole process
tree once it is gone, however the parent ended (even SIGKILL), so nothing is left holding ports.
"""

from __future__ import annotations

import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import requests

READY_TIMEOUT_S = float(os.environ.get("SGLANG_SLO_TEST_READY_TIMEOUT", "300"))
PORT_RETRIES = 2  # a picked port can be taken (by any process's outgoing connection) before we bind
PORT_TAKEN = "address already in use"
# A failed start names the port it found taken: uvicorn as "('host', P): address already in use",
# torch's rendezvous store (SGLang's scheduler binds one per server) as "port: P, ... EADDRINUSE".
TAKEN_PORT = re.compile(r", (\d+)\): address already in use|port: (\d+),[^\n]*EADDRINUSE")
# SGLang picks its scheduler's rendezvous port at random in this range as it starts (a port it
# binds only later, in a child); ours stay out of it so that no two picks meet.
SGLANG_RENDEZVOUS_PORTS = range(22_000, 30_000)
PARENT_PID_ENV = "SGLANG_SLO_PARENT_PID"  # set by ServerProcess: the child ends when this process is gone
PARENT_POLL_S = 0.5
STOP_TIMEOUT_S = 20.0

logger = logging.getLogger(__name__)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def kill_tree(pid: int, include_self: bool = True) -> None:
    """SIGKILL `pid`'s descendants (and `pid`)."""
    try:
        proc = psutil.Process(pid)
        family = proc.children(recursive=True) + ([proc] if include_self else [])
    except psutil.NoSuchProcess:
        return
    for member in family:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass


def watch_parent(
    on_orphaned: Callable[[], None] | None = None, poll_s: float = PARENT_POLL_S
) -> threading.Thread | None:
    """When started by a launcher (PARENT_PID_ENV set), end this process and its children as
    soon as the launcher is gone; None when there is no launcher to watch."""
    raw = os.environ.get(PARENT_PID_ENV)
    if not raw or not raw.isdigit():
        return None
    parent = int(raw)

    def watch() -> None:
        while _alive(parent):
            time.sleep(poll_s)
        logger.warning("launcher (pid %d) is gone: ending this process tree", parent)
        if on_orphaned is not None:
            on_orphaned()
        kill_tree(os.getpid(), include_self=False)
        os._exit(1)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


LOWEST_PORT = 10_000  # below: ports people run other services on


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = (int(v) for v in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32_768, 60_999  # Linux's default


def taken_port(log: str) -> int | None:
    """The port a failed start's log names as taken, or None when it failed otherwise."""
    found = TAKEN_PORT.search(log)
    return int(found.group(1) or found.group(2)) if found else None


def free_port() -> int:
    """A free port outside the kernel's ephemeral range. A client that keeps reconnecting to a
    port in that range while nobody listens there (ZMQ does, to a restarting router) can be
    handed that very port as its own local one and connect to itself (TCP simultaneous open),
    holding it: the server coming back then finds it taken ("Address already in use")."""
    low, _ = _ephemeral_range()
    if low - 1 > LOWEST_PORT:
        rng = random.Random()
        for _ in range(200):
            port = rng.randint(LOWEST_PORT, low - 1)
            if port in SGLANG_RENDEZVOUS_PORTS:
                continue
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
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
        self._attempt_from = 0  # the log's size when the latest start began

    def _set_port(self, port: int) -> None:
        self.port = port
        self.args = [*self.base_args, "--host", "127.0.0.1", "--port", str(port)]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> ServerProcess:
        """Start and wait until ready. A start that failed on a port taken meanwhile is tried
        again: on a fresh HTTP port when that was the one taken (`url` and `port` follow), as it
        was when the port was one SGLang picked itself (it picks anew). A port the caller named
        is not retried: it would be taken again."""
        for attempt in range(PORT_RETRIES + 1):
            try:
                return self._start_once()
            except RuntimeError:
                taken = taken_port(self._attempt_log())  # this attempt's: the log keeps earlier ones
                named_by_caller = taken is not None and taken != self.port and str(taken) in self.base_args
                if attempt == PORT_RETRIES or taken is None or named_by_caller:
                    raise
                logger.warning("%s: port %d was taken as it started; starting it again", self.log_path.name, taken)
                if taken == self.port:
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
        env[PARENT_PID_ENV] = str(os.getpid())
        self._attempt_from = self.log_path.stat().st_size
        with open(self.log_path, "ab") as log:  # a restarted server keeps its earlier log
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

    def _attempt_log(self) -> str:
        """What the latest start wrote to the log."""
        with open(self.log_path, "rb") as log:
            log.seek(self._attempt_from)
            return log.read().decode(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        # SGLang's one-line dump of every server argument would push a traceback out of the tail.
        kept = (line for line in text if "_pytree.py" not in line and "] server_args=" not in line)
        return "\n".join(kept)[-8000:] if text else ""

    def stop(self, timeout_s: float = STOP_TIMEOUT_S, graceful: bool = False) -> None:
        """SIGTERM, then SIGKILL after `timeout_s`. `graceful`: only the main process gets the
        SIGTERM (a worker then drains: its scheduler must live on meanwhile), else its group."""
        if self.proc is None:
            return
        pid = self.proc.pid
        try:
            family = psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        try:
            if graceful:
                os.kill(pid, signal.SIGTERM)
            else:
                os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(timeout=timeout_s)
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
