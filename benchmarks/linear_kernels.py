"""The products of one decode step through `F.linear` and through oneDNN's packed weights, side by side.

The 85 matrix products of one step of the 134M random Llama of the runtime benchmarks (12 layers of q, k, v,
o, gate, up and down, then the LM head), at each number of rows (the decode batch, or a prefill chunk), in each
dtype. Two systems, alternating round by round on the same weights and threads:

- `F.linear`: torch's product on the dense weight (`runtime.cpu_linear: torch`);
- packed: the weight reordered once into oneDNN's blocked layout, `torch.ops.mkldnn._linear_pointwise`
  (`runtime.cpu_linear: onednn`).

Prints each system's median (min-max) ms per step, and packed/F.linear as a speed ratio. The first line says
which of AVX-512 bf16 and AMX the CPU has: without them bfloat16 products run emulated, slower than float32.

    .venv/bin/python benchmarks/linear_kernels.py [--rows 1 8 32 64 512] [--dtypes float32 bfloat16]
        [--threads 2] [--rounds 6]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from servegate.runtime.model.onednn_linear import onednn_available, pack_weight

HIDDEN, MLP, LAYERS, VOCAB = 768, 2048, 12, 32000
SHAPES = [(HIDDEN, HIDDEN)] * 4 + [(MLP, HIDDEN), (MLP, HIDDEN), (HIDDEN, MLP)]
"""[out, in] of one layer's q, k, v, o, gate, up and down projections."""


def cpu_features(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """Which of the instruction sets that speed up bfloat16 products the CPU reports."""
    try:
        flags = set(next(ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")).split())
    except (OSError, StopIteration):
        return "CPU flags unreadable"
    have = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    lacking = [f for f in ("avx512_bf16", "amx_bf16") if f not in flags]
    note = f"; lacks {', '.join(lacking)}: bfloat16 products run without hardware support" if lacking else ""
    return f"CPU has {', '.join(have) or 'none of avx512f, avx512_bf16, amx_bf16'}{note}"


def step_weights(dtype: torch.dtype) -> list[torch.Tensor]:
    """One decode step's weights, in call order."""
    torch.manual_seed(0)
    shapes = SHAPES * LAYERS + [(VOCAB, HIDDEN)]
    return [(torch.randn(o, i) * 0.02).to(dtype) for o, i in shapes]


def timed(run: Callable[[], None]) -> float:
    """ms of one call of `run` (the mean of two, after one untimed)."""
    run()
    start = time.perf_counter()
    run()
    run()
    return (time.perf_counter() - start) / 2 * 1000


def main() -> None:
    """Print the per-step product times of both systems at every row count and dtype."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64, 512])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6, help="alternating rounds of each system")
    args = parser.parse_args()
    if not onednn_available():
        raise SystemExit("this torch build has no oneDNN (mkldnn): nothing to compare")
    torch.set_num_threads(args.threads)
    print(f"{cpu_features()}; torch {torch.__version__}, {args.threads} threads", flush=True)
    for name in args.dtypes:
        dtype = getattr(torch, name)
        dense = step_weights(dtype)
        packed = [pack_weight(w) for w in dense]
        for rows in args.rows:
            inputs = {width: torch.randn(rows, width).to(dtype) for width in (HIDDEN, MLP)}

            def plain(dense: list[torch.Tensor] = dense, inputs: dict[int, torch.Tensor] = inputs) -> None:
                for w in dense:
                    F.linear(inputs[w.shape[1]], w)

            def onednn(packed: list[torch.Tensor] = packed, inputs: dict[int, torch.Tensor] = inputs) -> None:
                for w in packed:
                    torch.ops.mkldnn._linear_pointwise(inputs[w.shape[1]], w, None, "none", [], "")

            times: dict[str, list[float]] = {"F.linear": [], "packed": []}
            for _ in range(args.rounds):  # alternate, so a change of load hits both alike
                times["F.linear"].append(timed(plain))
                times["packed"].append(timed(onednn))
            med = {k: statistics.median(v) for k, v in times.items()}
            print(
                f"{name} {rows:>4} rows: "
                + "; ".join(f"{k} {med[k]:.1f} ms ({min(v):.1f}-{max(v):.1f})" for k, v in times.items())
                + f"; packed {med['F.linear'] / med['packed']:.2f}x as fast",
                flush=True,
            )


if __name__ == "__main__":
    main()
