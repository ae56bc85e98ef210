"""Where a batch-1 decode step's time goes: the linear products, the rest, and why the rest grows.

The model and roofline of runner_decode.py (random Llama, 110M parameters read per step, float32), one
sequence decoding through PagedModelRunner with its linears routed through OpenBLAS as
`runtime.cpu_linear: openblas` does (the BLAS pool on --threads, torch on one thread). Four variants
of the same step, measured in alternating rounds so that load changes hit them alike:

- `step`: the real step; `in products` is the time spent inside the routed linear calls, `rest`
  everything else (norms, rotary, attention, the KV write, Python);
- `products alone`: the same 85 products back to back (same weights, same order), nothing between;
- `no products`: every linear returns zeros of its output's shape, so the step is the rest alone
  with the caches warm;
- `no products, weights swept`: as `no products`, but each linear first reads its weight (a sum on one
  thread, untimed), which evicts the caches as a product does.

`rest` of `step` against `no products` is the price of the products' cache pollution: every product
streams megabytes of weights through the caches the interpreter and torch's small ops need next.

    .venv/bin/python benchmarks/decode_breakdown.py [--threads 2] [--rounds 3] [--steps 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

import torch
from runner_decode import build_model, copy_bandwidth, weight_bytes_per_step

from servegate.runtime.model.cpu_linear import TORCH_DEFAULT_THREADS, route_linears, set_blas_threads
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.types import SeqChunk


class Clock:
    """Seconds spent inside wrapped calls since the last reset."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, adding the time each call takes to this clock."""

        def timed(*args: Any) -> Any:
            t0 = time.perf_counter()
            out = fn(*args)
            self.total += time.perf_counter() - t0
            return out

        return timed


@contextmanager
def linears_replaced(linears: list[torch.nn.Linear], make: Callable[[torch.nn.Linear], Callable[..., Any]]):
    """Each linear's forward replaced by make(linear) inside the block, restored after."""
    saved = [m.__dict__.get("forward") for m in linears]
    try:
        for m in linears:
            m.forward = make(m)
        yield
    finally:
        for m, forward in zip(linears, saved, strict=True):
            if forward is None:
                del m.forward
            else:
                m.forward = forward


def zeros_of(linear: torch.nn.Linear, sweep: Clock | None = None) -> Callable[[torch.Tensor], torch.Tensor]:
    """A forward that returns zeros of the linear's output shape; with `sweep`, it first reads the weight
    (the read's time goes to that clock, so the step's rest can be told apart)."""
    out_features, weight = linear.out_features, linear.weight.detach().numpy()
    read = sweep.wrap(weight.sum) if sweep is not None else None  # numpy reads the whole matrix on this thread

    def forward(x: torch.Tensor) -> torch.Tensor:
        if read is not None:
            read()
        return x.new_zeros(*x.shape[:-1], out_features)

    return forward


def decode_steps(runner: PagedModelRunner, steps: int) -> list[float]:
    """Seconds of each of `steps` batch-1 decode steps after a 16-token prefill."""
    table = tuple(range((16 + steps + runner.block_size - 1) // runner.block_size))
    runner.execute([SeqChunk(0, tuple(range(3, 19)), 0, table)])
    times = []
    for i in range(steps):
        t0 = time.perf_counter()
        runner.execute([SeqChunk(0, (5,), 16 + i, table)])
        times.append(time.perf_counter() - t0)
    return times


def products_alone(linears: list[torch.nn.Linear], steps: int) -> list[float]:
    """Seconds of each run of every routed linear's forward back to back, on one row of input."""
    inputs = [torch.rand(1, m.in_features) for m in linears]
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            t0 = time.perf_counter()
            for m, x in zip(linears, inputs, strict=True):
                m(x)
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    """Print the four variants' times per step in ms, and the step and the products against the roofline."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=None, help="BLAS threads (default: torch's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30, help="decode steps per variant and round")
    args = parser.parse_args()
    threads = args.threads or TORCH_DEFAULT_THREADS
    torch.set_num_threads(threads)
    model = build_model(torch.float32)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    route_linears(model)
    runner = PagedModelRunner(model, num_blocks=64, block_size=16)
    step_bytes = weight_bytes_per_step(model)
    print(f"random Llama, {step_bytes / 1e6:.0f} MB of weights read per step, float32, {threads} threads")
    clock = Clock()
    for round_ in range(args.rounds):
        torch.set_num_threads(threads)
        bandwidth = copy_bandwidth()
        roofline_ms = 1000 * step_bytes / bandwidth
        set_blas_threads(threads)
        torch.set_num_threads(1)
        clock.total = 0.0
        with linears_replaced(linears, lambda m: clock.wrap(m.forward)):
            step = decode_steps(runner, args.steps)
        in_products = clock.total / args.steps
        alone = products_alone(linears, args.steps)
        with linears_replaced(linears, zeros_of):
            bare = decode_steps(runner, args.steps)
        clock.total = 0.0
        with linears_replaced(linears, lambda m: zeros_of(m, sweep=clock)):
            swept = decode_steps(runner, args.steps)
        swept_rest = (sum(swept) - clock.total) / args.steps
        step_ms = 1000 * statistics.median(step)
        print(
            f"round {round_ + 1}: copy bandwidth {bandwidth / 1e9:.1f} GB/s, roofline {roofline_ms:.1f} ms/step "
            f"({1000 / roofline_ms:.1f} tokens/s)"
        )
        alone_ms = 1000 * statistics.median(alone)
        rows = [
            ("step (median)", step_ms),
            ("  in products (mean)", 1000 * in_products),
            ("  rest (mean)", 1000 * (sum(step) / args.steps - in_products)),
            ("products alone (median)", alone_ms),
            ("no products (median)", 1000 * statistics.median(bare)),
            ("no products, weights swept: rest (mean)", 1000 * swept_rest),
        ]
        for name, ms in rows:
            print(f"  {name:<42} {ms:7.1f} ms")
        print(
            f"  batch-1 decode: {1000 / step_ms:.1f} tokens/s = {roofline_ms / step_ms:.0%} of the roofline; "
            f"the products alone would be {roofline_ms / alone_ms:.0%}"
        )


if __name__ == "__main__":
    main()
