"""Output tokens/s of the real chat model on three engines, each behind servegate's gateway, interleaved.

SmolLM2-135M-Instruct (the zoo's model) served three ways, as `gate serve` runs each manifest
(`LocalServer`), so the gateway's own cost is the same on every side:

- **servegate**: its reference runtime on the zoo's float32 weights (examples/smollm2/manifest.yaml);
- **vLLM**: vLLM's CPU build (`runtime.backend: vllm`, `$SERVEGATE_VLLM_PYTHON`) on the same folder, float32;
- **llama.cpp**: llama-server (`runtime.backend: llamacpp`, `$SERVEGATE_LLAMACPP_SERVER` or `make llamacpp`) on
  the f16 GGUF that `make gguf-builds` converts from the same weights (llama.cpp multiplies f16 weights against
  activations in its own kernels; its KV cache is float32 as the others').

All get 2 threads, continuous batching of up to 8 sequences and 640 tokens a step, no prefix cache. Each
run is a closed loop at one concurrency: prompts of exactly --prompt tokens, --output tokens each (EOS
ignored). The systems alternate within each round (servegate, vLLM, llama.cpp, servegate, ...), and the two
idle servers' processes are frozen (SIGSTOP) while one runs: idle, vLLM's worker polls, and llama.cpp's
threads spin at every barrier of a step, so a busy neighbour slows it many times over. Prints each run with
the load average at its start, then per concurrency the median output tokens/s (min-max) and the ratios.

    SERVEGATE_VLLM_PYTHON=.venvs/vllm/bin/python SERVEGATE_LLAMACPP_SERVER=.venvs/llamacpp/bin/llama-server \
        .venv/bin/python benchmarks/llamacpp_throughput.py [--rounds 2] [--concurrency 1 8] [--systems ...]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import tempfile
from collections import defaultdict
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psutil
import yaml

from servegate.capacity.bench.local_server import LocalServer
from servegate.capacity.bench.own_server import bench_url, manifest_tokenizer
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.loading import deep_merge, load_manifest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "smollm2"
SHARED: dict[str, Any] = {
    "runtime": {"device": "cpu", "threads": 2, "kv_cache": {"block_size": 32, "memory_budget": "256MiB"}},
    "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 640},
    "failure_policy": {"request_timeout_s": 3600, "max_queue": 10000},
}
"""What every system is configured with (vLLM's CPU attention takes blocks of 32)."""
OWN: dict[str, dict[str, Any]] = {
    "servegate": {"include": str(EXAMPLES / "manifest.yaml")},
    "vllm": {"include": str(EXAMPLES / "manifest.yaml"), "runtime": {"backend": "vllm"}},
    "llamacpp": {
        "include": str(EXAMPLES / "llamacpp.yaml"),
        "weights": {
            "source": str(EXAMPLES / "gguf-builds" / "f16"),
            "gguf_file": "SmolLM2-135M-Instruct-F16.gguf",
            "derived_from": None,
        },
    },
}
"""Each system's own part of its manifest."""


def manifest_file(system: str, folder: Path) -> Path:
    """The system's manifest, written to `folder`."""
    path = folder / f"{system}.yaml"
    doc = deep_merge({"name": f"bench-{system}", **SHARED}, OWN[system])
    path.write_text(yaml.safe_dump({"include": doc.pop("include"), **doc}, sort_keys=False))
    return path


def freeze(server: LocalServer, stop: bool) -> None:
    """SIGSTOP (or SIGCONT) the server and every process under it (an engine in its own process group too)."""
    if server.pid is None:
        return
    root = psutil.Process(server.pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            os.kill(proc.pid, signal.SIGSTOP if stop else signal.SIGCONT)
        except ProcessLookupError:
            pass


def main() -> None:
    """Start the servers, run the interleaved rounds, print each run and the medians with their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=128, help="prompt tokens")
    parser.add_argument("--output", type=int, default=64, help="output tokens")
    parser.add_argument("--requests-per-slot", type=int, default=3, help="requests per run = this x concurrency")
    parser.add_argument("--systems", nargs="+", default=list(OWN), choices=list(OWN))
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="servegate-llamacpp-bench-"))
    servers = {s: LocalServer(load_manifest(manifest_file(s, folder), []), 900.0, folder / f"{s}.log")
               for s in args.systems}  # fmt: skip
    tokenizer = manifest_tokenizer(servers[args.systems[0]].served)
    results: dict[tuple[str, int], list[float]] = defaultdict(list)
    with ExitStack() as stack:
        for system, server in servers.items():
            server.start()
            stack.callback(server.stop)
            freeze(server, True)
            print(f"{system}: ready ({server.served.runtime.backend}), log {folder / (system + '.log')}", flush=True)
        for rnd in range(1, args.rounds + 1):
            for conc in args.concurrency:
                length = LengthDistribution(mean=args.prompt, min=args.prompt, max=args.prompt)
                out = LengthDistribution(mean=args.output, min=args.output, max=args.output)
                workload = Workload(arrival="closed", concurrency=conc, num_requests=args.requests_per_slot * conc,
                                    input_tokens=length, output_tokens=out)  # fmt: skip
                for system, server in servers.items():
                    freeze(server, False)
                    load = os.getloadavg()[0]
                    try:
                        report = bench_url(server.url, workload, served=server.served, tokenizer=tokenizer, seed=rnd)
                    finally:
                        freeze(server, True)
                    data = report.as_dict()
                    tps, failed = data["throughput"]["output_tokens_per_s"], data["requests"]["failed"]
                    results[(system, conc)].append(tps)
                    print(f"round {rnd} concurrency {conc} {system}: {tps:.1f} output tokens/s, TPOT p50 "
                          f"{data['tpot_ms']['p50']:.1f} ms, {failed} failed, load {load:.2f}", flush=True)  # fmt: skip
        for server in servers.values():
            freeze(server, False)
    print("\nmedian output tokens/s (min-max):")
    for conc in args.concurrency:
        row = {s: results[(s, conc)] for s in args.systems}
        cells = [f"{s} {statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" for s, v in row.items()]
        print(f"concurrency {conc}: " + "; ".join(cells))
        for other in (s for s in args.systems if s != "llamacpp"):
            if "llamacpp" in row:
                ratio = statistics.median(row["llamacpp"]) / statistics.median(row[other])
                print(f"  llama.cpp / {other}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
