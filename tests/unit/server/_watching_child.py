"""A server stand-in that watches its launcher, as launch_server and launch_router do, and has
a child of its own (as SGLang's HTTP process has its scheduler)."""

from __future__ import annotations

import subprocess
import sys

from server.process import watch_parent
from tests.unit.server._health_server import main as serve

if __name__ == "__main__":
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    watch_parent(poll_s=0.1)
    serve()
