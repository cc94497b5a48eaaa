"""A minimal server that, like SGLang's, binds a rendezvous port of its own picking (a real torch
TCPStore) before it serves HTTP; its first start picks the port named in `RENDEZVOUS_FIRST_PORT`
and every start the one given as `--rendezvous-port`, for ServerProcess's own tests."""

from __future__ import annotations

import os
import sys
from http.server import HTTPServer
from pathlib import Path

from torch.distributed import TCPStore

from tests.unit.server._health_server import Health


def main() -> None:
    args = sys.argv[1:]
    host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
    started_before = Path(os.environ["RENDEZVOUS_MARKER"])
    rendezvous_port = 0 if started_before.exists() else int(os.environ["RENDEZVOUS_FIRST_PORT"])
    if "--rendezvous-port" in args:
        rendezvous_port = int(args[args.index("--rendezvous-port") + 1])
    started_before.touch()
    store = TCPStore("127.0.0.1", rendezvous_port, is_master=True, wait_for_workers=False)  # raises when taken
    print(f"rendezvous on port {store.port}", flush=True)
    HTTPServer((host, port), Health).serve_forever()


if __name__ == "__main__":
    main()
