"""launch_cluster leaves nothing behind: SIGTERM it and, 3 s later, SIGKILL it (what a
supervisor does), and within seconds no process it started runs or holds a port. Once measured
with examples/cluster-pd.yaml: the router and a decode worker (with its scheduler and
detokenizer) kept running for 35 minutes. A router and one tiny-model worker here; about 1 min.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_a_killed_launcher_leaves_no_process_and_no_port(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text("router: {}\nworkers:\n  - model_path: tiny\n")
    workers_file = tmp_path / "workers.json"
    log = (tmp_path / "launcher.log").open("wb")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "launch_cluster", str(config), "--workers-file", str(workers_file)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while not workers_file.exists():
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the cluster did not start"
            time.sleep(0.5)
        processes = json.loads(workers_file.read_text())
        ports = [int(p["url"].rsplit(":", 1)[1]) for p in processes]
        family = psutil.Process(launcher.pid).children(recursive=True)
        assert len(family) >= 4  # router, worker, and the worker's scheduler and detokenizer
        launcher.send_signal(signal.SIGTERM)
        time.sleep(3)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(10)
        _, alive = psutil.wait_procs(family, timeout=15)
        assert not alive, f"outlived the launcher: {[(p.pid, p.name()) for p in alive]}"
        assert all(_port_free(port) for port in ports), ports
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for p in psutil.Process().children(recursive=True):
            if p.pid != launcher.pid:
                p.kill()
