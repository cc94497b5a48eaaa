"""A launcher stand-in for the orphan test: starts a child that watches it, prints the child's
PID, then waits to be killed."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from server.process import ServerProcess

ROOT = Path(__file__).resolve().parents[3]


def main() -> None:
    child = ServerProcess(module="tests.unit.server._watching_child", cwd=ROOT, name="orphan-child")
    child.start()
    assert child.proc is not None
    print(child.proc.pid, flush=True)
    sys.stdout.close()
    time.sleep(600)


if __name__ == "__main__":
    main()
