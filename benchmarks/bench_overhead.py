"""How much `gate bench` itself adds to time-to-first-token, measured against a null server.

The null server (tests/support/synthetic_server.py with zero delays, in its own process) answers every
request at once. The same streamed completion requests are sent by:

  raw     a minimal asyncio socket client: the floor (kernel, event loop and server)
  bench   the bench's own request path (HttpTarget over its SSE client), with this machine's speed sampled
          meanwhile as `gate bench` does (machine_speed.py: a loop timed on every CPU every 50 ms)
  bare    the same path with no sampling, to show what the sampling costs
  httpx   httpx's streaming client (what the bench avoids on its hot path), for reference

twice: one request at a time (closed loop, TTFT from the send), and open loop at --rate requests/s where
TTFT counts from each request's scheduled send time (the raw client then waits for the same schedule
with plain asyncio sleeps). The bench's overhead is its median TTFT minus the raw client's. Target: < 1 ms.

    python benchmarks/bench_overhead.py [--requests 400] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import httpx

from servegate.capacity.bench.load_generator import run_closed_loop, run_open_loop
from servegate.capacity.bench.local_server import free_port
from servegate.capacity.bench.machine_speed import MachineSpeedMonitor
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.capacity.bench.workload import RequestSpec

SYNTHETIC_SERVER = Path(__file__).resolve().parent.parent / "tests" / "support" / "synthetic_server.py"
"""The null server: an OpenAI-compatible server with declared delays, shipped with the tests."""

BODY = {"model": "m", "prompt": "hello", "max_tokens": 1, "stream": True}


async def raw_ttfts(port: int, n: int, rate: float | None) -> list[float]:
    """TTFT of a bare socket client, sequential (rate None) or on a Poisson-free fixed schedule."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps(BODY).encode()
    request = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
    out = []
    start = time.perf_counter() + 0.01
    for i in range(n):
        t0 = time.perf_counter()
        if rate is not None:
            t0 = start + i / rate
            await asyncio.sleep(max(0.0, t0 - time.perf_counter()))
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        await reader.readuntil(b"\n\n")  # the first event
        out.append(time.perf_counter() - t0)
        await reader.readuntil(b"0\r\n\r\n")
    writer.close()
    return out


async def httpx_ttfts(url: str, n: int) -> list[float]:
    """TTFT of httpx's streaming client, one request at a time."""
    out = []
    async with httpx.AsyncClient() as client:
        for _ in range(n):
            t0 = time.perf_counter()
            first = None
            async with client.stream("POST", url + "/completions", json=BODY) as resp:
                async for line in resp.aiter_lines():
                    if first is None and line.startswith("data:"):
                        first = time.perf_counter()
            out.append((first or time.perf_counter()) - t0)
    return out


async def bench_ttfts(url: str, n: int, rate: float | None, sampled: bool = True) -> list[float]:
    """TTFT through the bench: closed loop of one (rate None) or open loop on the same fixed schedule; with the
    machine's speed sampled meanwhile unless `sampled` is False."""
    target = HttpTarget(url, model="m")
    await target.probe()
    with MachineSpeedMonitor() if sampled else nullcontext():
        if rate is None:
            records = await run_closed_loop(target, [RequestSpec(5, 1, None)] * n, PromptFactory(), 1)
        else:
            records = await run_open_loop(target, [RequestSpec(5, 1, i / rate) for i in range(n)], PromptFactory())
    await target.aclose()
    return [r.ttft for r in records if r.ok]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=50.0, help="open-loop rate, requests/s")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, str(SYNTHETIC_SERVER), str(port)], stdout=subprocess.PIPE, text=True)
    rows = []
    try:
        url = server.stdout.readline().strip()  # type: ignore[union-attr]
        for label, rate in (("one at a time", None), (f"open loop {args.rate:g} req/s", args.rate)):
            raw = 1000 * statistics.median(asyncio.run(raw_ttfts(port, args.requests, rate)))
            bench = 1000 * statistics.median(asyncio.run(bench_ttfts(url, args.requests, rate)))
            bare = 1000 * statistics.median(asyncio.run(bench_ttfts(url, args.requests, rate, sampled=False)))
            rows.append((label, raw, bench, bare))
        via_httpx = 1000 * statistics.median(asyncio.run(httpx_ttfts(url, args.requests)))
    finally:
        server.terminate()
        server.wait()
    print(f"null-server TTFT, median of {args.requests} requests (ms)")
    print(f"{'':24}{'raw client':>12}{'gate bench':>12}{'added':>10}{'unsampled':>11}")
    for label, raw, bench, bare in rows:
        print(f"{label:24}{raw:12.3f}{bench:12.3f}{bench - raw:10.3f}{bare:11.3f}")
    print(f"httpx streaming client, one at a time: {via_httpx:.3f} ms")
    print("unsampled: the bench's path with no machine-speed sampling beside it")
    worst = max(bench - raw for _, raw, bench, _ in rows)
    verdict = "PASS" if worst < 1 else "FAIL"
    print(f"bench overhead: at most {worst:.3f} ms median added to TTFT -> {verdict} (target < 1 ms)")


if __name__ == "__main__":
    main()
