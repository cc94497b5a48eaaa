"""A minimal HTTP server with SGLang's launch arguments (`--host H --port P`) and uvicorn's
message when the port is taken, for ServerProcess's own tests."""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    args = sys.argv[1:]
    host, port = args[args.index("--host") + 1], int(args[args.index("--port") + 1])
    try:
        server = HTTPServer((host, port), Health)
    except OSError as e:
        print(
            f"ERROR:    [Errno {e.errno}] error while attempting to bind on address ('{host}', {port}): "
            "address already in use",
            flush=True,
        )
        import time

        time.sleep(600)  # like SGLang, whose other processes keep the launcher alive
        return
    server.serve_forever()


if __name__ == "__main__":
    main()
