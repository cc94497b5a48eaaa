"""Run by test_goodput_compare: a parallel group's load against a slow in-process stand-in for
/generate, with the harness's signal handlers; prints LOADING once the first request streams."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading

from aiohttp import web

from benchmarks._server import install_signal_handlers
from benchmarks.goodput.harness import Target, run_group
from benchmarks.goodput.loadgen import LengthControl
from benchmarks.goodput.records import PlannedRequest
from benchmarks.workloads.traces import TraceRequest

started = threading.Event()


async def generate(request: web.Request) -> web.StreamResponse:
    await request.json()
    resp = web.StreamResponse()
    await resp.prepare(request)
    started.set()
    for i in range(100_000):  # one token a second: the load would take hours
        await resp.write(b'data: {"output_ids": [%d], "meta_info": {"completion_tokens": 1}}\n\n' % i)
        await asyncio.sleep(1.0)
    return resp


def serve(port_box: list[int], ready: threading.Event) -> None:
    async def main() -> None:
        app = web.Application()
        app.router.add_post("/generate", generate)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_box.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def announce() -> None:
    started.wait()
    print("LOADING", flush=True)


if __name__ == "__main__":
    install_signal_handlers()
    box: list[int] = []
    ready = threading.Event()
    threading.Thread(target=serve, args=(box, ready), daemon=True).start()
    ready.wait()
    threading.Thread(target=announce, daemon=True).start()
    url = f"http://127.0.0.1:{box[0]}"
    args = argparse.Namespace(
        control=LengthControl.CLIENT,
        client_max_tokens=100_000,
        duration=None,
        drain_timeout=100_000.0,
        drain_until_due=False,
        max_drain=100_000.0,
        seed=0,
        quiet=True,
        bin_s=None,
    )
    planned = [
        PlannedRequest(TraceRequest(arrival_s=0.0, prompt_tokens=4, output_tokens=100_000, rid="r0"), "none", {})
    ]
    run_group([Target("a", url, args), Target("b", url, args)], planned, lambda p, rng: [1, 2, 3, 4], args, 1.0)
    sys.exit(3)  # not reached unless the load ended on its own
