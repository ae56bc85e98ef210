"""Linear layers on CPU through OpenBLAS (numpy's BLAS) instead of torch's MKL.

On CPUs that are not Intel's, the MKL build torch ships reads a float32 weight matrix for a
matrix-vector product at about half the memory bandwidth OpenBLAS reaches, and its single-row path
does not use a second core at all. Measured on a 2-core AMD EPYC VM (benchmarks/README.md): the
32000 x 768 LM head read at 12 GB/s by torch and 21 GB/s by OpenBLAS with 2 threads; small-batch
products (2-32 rows) ran 1.3-2x faster, and large ones (512 rows) no slower. Decode steps are
matrix-vector products over every weight, so this is what decides tokens/s at small batch.

`runtime.cpu_linear: onednn` (onednn_linear.py) is the other route: weights packed once for oneDNN, on torch's
own threads, which batched decode steps gain from (benchmarks/README.md, "Packed weights and consecutive blocks").

`route_linears(model)` rewires every `nn.Linear` whose weight is a plain float32 (or float64) CPU tensor
(quantized weights are tensor subclasses with their own kernels and stay as they are). The routed
forward falls back to `F.linear` for anything else (other dtypes, autograd), and re-reads the weight
when it was replaced or moved, so `model.to(...)` after routing stays correct.
"""

from __future__ import annotations

import functools
import os
import types
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F

from servegate.contracts.sections import AUTO_MIN_WEIGHT_BYTES, auto_packs_for_onednn
from servegate.runtime.model.fused_linear import route_linears_onednn
from servegate.runtime.model.onednn_linear import (
    ONEDNN_DTYPES,
    is_dense_cpu,
    onednn_available,
    packable_linears,
    require_onednn,
    weight_bytes,
)

CpuLinear = Literal["auto", "torch", "openblas", "onednn"]
Kernel = Literal["torch", "openblas", "onednn"]
"""The kernel `runtime.cpu_linear` resolves to on this machine (`auto` is a choice, not a kernel)."""

TORCH_DEFAULT_THREADS = torch.get_num_threads()
"""torch's intra-op threads when servegate's runtime was first imported (its default: the physical cores,
or OMP_NUM_THREADS when set)."""


def default_threads() -> int:
    """The threads a runtime gets when its manifest leaves `runtime.threads` unset: OMP_NUM_THREADS when
    set, else half the cores torch counts, at least one.

    Not every core, as torch would: torch waits at the end of each parallel op for its slowest thread, so a
    team as large as the machine stalls whenever anything else takes a core, the server's own HTTP thread
    and a load generator included. On the 2-core VM the quickstart's decode steps took 4 ms on one thread
    and 250 ms on two with two processes spinning at nice 19 beside it (benchmarks/README.md, "Threads and
    contention"); half leaves a core per thread for the rest.
    """
    if os.environ.get("OMP_NUM_THREADS", "").strip().isdigit() and int(os.environ["OMP_NUM_THREADS"]) > 0:
        return int(os.environ["OMP_NUM_THREADS"])
    return max(1, TORCH_DEFAULT_THREADS // 2)


def use_torch_threads(threads: int | None) -> None:
    """Give torch `threads` intra-op threads (a manifest's `runtime.threads`), else default_threads().

    Every model load starts from its own manifest's setting: a model routed to OpenBLAS earlier in the
    process left torch on one thread, which would otherwise carry over to the next model loaded.
    """
    torch.set_num_threads(threads or default_threads())


def cpu_vendor(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's vendor id (e.g. GenuineIntel, AuthenticAMD), or '' when it cannot be read."""
    try:
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("vendor_id"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.cache
def numpy_blas() -> str:
    """The BLAS numpy calls into ('openblas', 'mkl', ...), or '' when threadpoolctl cannot see one."""
    from threadpoolctl import threadpool_info

    np.ones((2, 2)) @ np.ones((2, 2))  # make sure numpy's BLAS is loaded before asking
    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            return str(pool.get("internal_api", ""))
    return ""


def resolve_cpu_linear(
    choice: CpuLinear, device: torch.device, dtype: torch.dtype, *, weight_bytes: int, compiled: bool = False
) -> Kernel:
    """The kernel a model's plain linear layers run on.

    `openblas` and `onednn` whenever the device and dtype allow (float32 for OpenBLAS, float32 and bfloat16 for
    oneDNN). `auto`, when `weight_bytes` (the float linear weights) are at least AUTO_MIN_WEIGHT_BYTES: oneDNN
    for bfloat16 (packed bf16 products ran 1.45x faster than F.linear's at 1 row and 1.6x at 64 on an AMX Xeon,
    benchmarks/README.md), OpenBLAS for float32 on a non-Intel CPU; `torch` otherwise.

    `compiled`: the eager steps beside compiled graphs (`runtime.compile: decode` or `steps`). `auto` then never
    picks OpenBLAS, which would take the graphs' torch threads down to one (the manifest refuses `openblas`
    there for the same reason); it keeps oneDNN for bfloat16.
    """
    if device.type != "cpu" or choice == "torch":
        return "torch"
    if choice == "onednn":
        require_onednn()
        return "onednn" if dtype in ONEDNN_DTYPES else "torch"
    if choice == "auto" and dtype == torch.bfloat16:
        return "onednn" if auto_packs_for_onednn("bfloat16", weight_bytes) and onednn_available() else "torch"
    if dtype != torch.float32:
        return "torch"
    if choice == "openblas":
        if numpy_blas() != "openblas":
            raise ValueError(
                f"runtime.cpu_linear is openblas but numpy's BLAS is {numpy_blas() or 'unknown'}: "
                "install a numpy wheel from PyPI (it bundles OpenBLAS) or set cpu_linear: torch"
            )
        return "openblas"
    if weight_bytes < AUTO_MIN_WEIGHT_BYTES or compiled:
        return "torch"
    return "openblas" if cpu_vendor() != "GenuineIntel" and numpy_blas() == "openblas" else "torch"


def set_blas_threads(threads: int) -> None:
    """Size numpy's BLAS thread pool (process-wide, like torch.set_num_threads)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")


BLAS_DTYPES = (torch.float32, torch.float64)
"""Weight dtypes OpenBLAS multiplies natively (sgemm/dgemm)."""


def _is_plain_float(weight: Any) -> bool:
    """A dense float32/float64 CPU tensor (not a quantized tensor subclass, not a meta tensor)."""
    return is_dense_cpu(weight, BLAS_DTYPES)


def _blas_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """y = x W^T + b with numpy's matmul on float CPU tensors outside autograd; F.linear otherwise."""
    weight = self.weight
    if (
        x.dtype != weight.dtype
        or x.device.type != "cpu"
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
        or not _is_plain_float(weight)
    ):
        return F.linear(x, weight, self.bias)
    # _servegate_blas is a plain attribute route_linears adds; nn.Module types undeclared ones as Tensor | Module
    cached: tuple[int, Any] = self._servegate_blas  # type: ignore[assignment]
    if cached[0] != weight.data_ptr():  # weight replaced or moved since routing: take the new one
        cached = self._servegate_blas = (weight.data_ptr(), weight.detach().numpy().T)  # type: ignore[assignment]
    rows = x.reshape(-1, x.shape[-1])
    out = np.matmul(rows.detach().numpy(), cached[1])
    result = torch.from_numpy(out).view(*x.shape[:-1], out.shape[-1])
    if self.bias is not None:
        result += self.bias
    return result


def _plain_linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's `nn.Linear`s whose weight is a plain float32/float64 CPU tensor."""
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear) and _is_plain_float(m.weight)]


def routable_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the linear weights `route_linears` would route."""
    return weight_bytes(_plain_linears(model))


def route_linears(model: torch.nn.Module) -> int:
    """Send every plain float32/float64 CPU `nn.Linear` of `model` through OpenBLAS; returns how many were."""
    linears = _plain_linears(model)
    for module in linears:
        module._servegate_blas = (-1, None)  # type: ignore[assignment]  # filled on first call
        module.forward = types.MethodType(_blas_forward, module)  # type: ignore[method-assign]  # this instance only
    return len(linears)


def apply_cpu_linear(model: torch.nn.Module, choice: CpuLinear, threads: int | None, *, compiled: bool = False) -> int:
    """Route the model's linears as `runtime.cpu_linear` says and size the thread pools; returns how many were.
    `compiled`: the model's decode graphs are compiled already, over their own view of the weights
    (compiled_decode.compile_view), and these are the linears of the eager steps (see resolve_cpu_linear).

    Routed to OpenBLAS, the BLAS pool gets the threads (`runtime.threads`, else default_threads()) and torch
    keeps one: OpenBLAS's workers spin between calls, and torch's OpenMP workers spin after each parallel op,
    so two pools on the same cores slow every step down (2x measured); torch's remaining work at decode (norms,
    rotary, attention over one query) is too small to gain from a second thread. oneDNN runs on torch's own
    OpenMP pool, which keeps the threads.
    """
    parameter = next(model.parameters(), None)
    if parameter is None:
        return 0
    dtype = getattr(model, "dtype", None) or parameter.dtype
    # OpenBLAS takes no bfloat16: for it, what oneDNN would pack decides
    linears = packable_linears(model) if dtype == torch.bfloat16 else _plain_linears(model)
    kernel = resolve_cpu_linear(choice, parameter.device, dtype, weight_bytes=weight_bytes(linears), compiled=compiled)
    if kernel == "onednn":
        return route_linears_onednn(model)
    if kernel == "torch":
        return 0
    set_blas_threads(threads or default_threads())
    torch.set_num_threads(1)
    return route_linears(model)
