"""The decode attention kernel: every decoding row of a step attends its paged context in one call per layer.

torch has no CPU op that reads a block table, so the runtime's default decode attention is one SDPA call per
sequence per layer over its context (`paged_attention.py`). At batch 64 that is 768 calls a step, and each
call converts bfloat16 to float32 and back on its own: on the 2-core Xeon VM, 12 layers of decode attention
over 64 contexts of ~200 tokens took 52-55 ms in bfloat16 and 70-74 ms in float32 that way, against 36-38 and
45-47 ms for this kernel (benchmarks/README.md, "The decode attention kernel"). Scoring bfloat16 keys with
vdpbf16ps, where the CPU has AVX512-BF16, took bfloat16 from 41-43 to 36-38 ms again in a later run. Summing scores
and exponentiating 16 at a time, bfloat16 values through vdpbf16ps and the next block prefetched made it another
1.21-1.45x faster in float32 and 1.50-1.75x in bfloat16 (`benchmarks/decode_kernel_bench.py`). Asking for
blocks four ahead into L2, and for each block's values while its keys are read, made it 1.28-1.64x faster again:
one block is read faster than memory answers, so a single block ahead left the kernel waiting on memory.

The kernel (`kernels/decode_attention.c`) is plain C with GCC vector types and OpenMP: one task per (sequence,
KV head), reading each key and value row of the context once where its block lies, scores and sums in float32.
For bfloat16 values it rounds the probabilities to bfloat16 first, as SDPA's own bfloat16 kernel does.
A task's arithmetic does not depend on the others, so a sequence's result is the same bits at any batch size.

It is built at first use with the machine's C compiler (`$CC`, else cc or gcc; `-O3 -march=native -fopenmp`)
into `$SERVEGATE_KERNELS/<key>/` (default `$SERVEGATE_HOME/kernels`), where the key covers the source, the
compiler, the flags and the CPU, so a home shared by different machines never loads a library built for another
CPU. The build takes 2-4 s; it is written beside its final name and renamed into place, so a crash leaves nothing
half-built. The library links
the OpenMP runtime torch has already loaded (libgomp), so its threads are torch's threads, not a second team.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch

from servegate.contracts.errors import ServegateError
from servegate.contracts.home import make_kept_folder, servegate_home
from servegate.runtime.model.batched_decode import DecodeRow, decode_batch

log = logging.getLogger("servegate.runtime")

SOURCE = Path(__file__).parent / "kernels" / "decode_attention.c"
"""The kernel's C source, shipped with the package."""
FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC")
"""How it is compiled: for the CPU it runs on, with OpenMP for torch's threads."""
KERNEL_EVENT = "servegate::decode_attention"
"""The name a kernel call has in torch profiler traces (the call itself is C, invisible to the profiler)."""
DTYPES = {torch.float32: "decode_attention_f32", torch.bfloat16: "decode_attention_bf16"}
"""Compute dtypes the kernel takes, and the symbol of each."""

FAILURES = {
    1: "a head size that is not a multiple of 16",
    2: "a row with no visible key, or out of memory",
    4: "a context longer than its block table holds, or a block id outside the pool",
}
"""The bits of the kernel's return code, and what each means (the kernel checks before it reads)."""

_LOCK = threading.Lock()
_LOADED: dict[str, DecodeKernel] = {}  # build key -> the loaded kernel: one dlopen per process


class KernelUnavailable(ServegateError):
    """The kernel cannot be built or loaded here; the message says why and what to do."""


@dataclass(frozen=True)
class DecodeKernel:
    """The loaded kernel library and where it was built."""

    library: ctypes.CDLL
    path: Path
    """The shared library loaded."""

    def attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        table: torch.Tensor,
        lengths: torch.Tensor,
        first: torch.Tensor,
        block_size: int,
        scale: float,
        softcap: float | None,
    ) -> torch.Tensor:
        """Attention of B decode rows: q [B, Hkv, G, D] (G query heads per KV head), one layer's pools
        keys/values [Hkv, slots, D], table [B, N] block ids, lengths [B] cached positions, first [B] first
        visible position -> [B, Hkv, G, D] in q's dtype."""
        if q.dtype not in DTYPES or keys.dtype != q.dtype or values.dtype != q.dtype:
            raise ValueError(f"decode kernel: q, keys and values must share float32 or bfloat16 (got {q.dtype})")
        batch, kv_heads, groups, head_dim = q.shape
        q = q.contiguous()
        out = torch.empty_like(q)
        tensors = (q, keys, values, table, lengths, first)
        if not all(t.is_contiguous() for t in tensors) or table.dtype != torch.int64:
            raise ValueError("decode kernel: inputs must be contiguous, the table int64")
        function = getattr(self.library, DTYPES[q.dtype])
        with torch.profiler.record_function(KERNEL_EVENT):
            failed = function(
                q.data_ptr(),
                keys.data_ptr(),
                values.data_ptr(),
                table.data_ptr(),
                table.shape[1],
                lengths.data_ptr(),
                first.data_ptr(),
                out.data_ptr(),
                batch,
                kv_heads,
                groups,
                head_dim,
                keys.shape[1],
                block_size,
                ctypes.c_float(scale),
                ctypes.c_float(softcap or 0.0),
                torch.get_num_threads(),
            )
        if failed:
            reasons = "; ".join(why for bit, why in FAILURES.items() if failed & bit)
            raise RuntimeError(f"decode kernel failed: {reasons}")
        return out


def kernel_takes(dtype: torch.dtype, device: torch.device, head_dim: int) -> bool:
    """Whether decode rows of this compute dtype, device and head size can go through the kernel."""
    return dtype in DTYPES and device.type == "cpu" and head_dim % 16 == 0


def load_decode_kernel() -> DecodeKernel:
    """The kernel, built here on first use and kept; raises KernelUnavailable saying why when it cannot be."""
    compiler = _compiler()
    key = _build_key(compiler, SOURCE)
    with _LOCK:
        if key not in _LOADED:
            path = kernel_root() / key / "decode_attention.so"
            if not path.is_file():
                _build(compiler, path, SOURCE)
            _LOADED[key] = DecodeKernel(_open(path), path)
        return _LOADED[key]


def kernel_root() -> Path:
    """Where built kernels are kept: $SERVEGATE_KERNELS, else $SERVEGATE_HOME/kernels (read at each call)."""
    return Path(os.environ.get("SERVEGATE_KERNELS") or servegate_home() / "kernels")


def _compiler() -> str:
    """The C compiler: $CC when set, else cc or gcc on PATH."""
    named = os.environ.get("CC")
    found = shutil.which(named) if named else shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise KernelUnavailable(
            f"the decode attention kernel needs a C compiler and {'$CC (' + named + ')' if named else 'none'} was "
            "found: install one (Debian: apt-get install gcc) or set runtime.decode_attention: sdpa"
        )
    return found


@functools.lru_cache(maxsize=8)
def _build_key(compiler: str, source: Path) -> str:
    """A digest of everything the built library depends on: source, compiler, flags and this CPU (once per
    process: every engine build loads the kernel, and asking the compiler its version is a subprocess)."""
    digest = hashlib.sha256(source.read_bytes())
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(
            f"the C compiler {compiler} does not run ({exc}): set runtime.decode_attention: sdpa"
        ) from None
    for part in (compiler, version, " ".join(FLAGS), platform.machine(), _cpu_identity()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def _cpu_identity() -> str:
    """The CPU's model name and feature flags (-march=native builds for exactly these)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    wanted = ("model name", "flags", "Features", "CPU implementer", "CPU part")
    return "\n".join(sorted({line for line in lines if line.split(":")[0].strip() in wanted}))


def _build(compiler: str, path: Path, source: Path) -> None:
    """Compile `source` to `path`: into a sibling first, renamed into place, so a crash leaves no half library."""
    make_kept_folder(
        path.parent, "the decode attention kernel", "SERVEGATE_KERNELS (or SERVEGATE_HOME)", KernelUnavailable
    )
    scratch = path.with_name(f".{path.stem}-{uuid.uuid4().hex[:8]}.so")
    command = [compiler, *FLAGS, "-o", str(scratch), str(source), "-lm"]
    log.info("building the decode attention kernel: %s", " ".join(command))
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise KernelUnavailable(
                f"building the decode attention kernel failed ({' '.join(command)}): {' / '.join(tail)}; set "
                "runtime.decode_attention: sdpa"
            )
        os.replace(scratch, path)  # of two builds racing, either whole library is the same one
    except (OSError, subprocess.SubprocessError) as exc:
        raise KernelUnavailable(f"building the decode attention kernel failed ({exc})") from None
    finally:
        scratch.unlink(missing_ok=True)


def _open(path: Path) -> ctypes.CDLL:
    """dlopen the library and declare its two functions (torch is imported first, so libgomp is torch's own)."""
    try:
        library = ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelUnavailable(
            f"cannot load the decode attention kernel {path} ({exc}): delete it to rebuild"
        ) from None
    pointer, int64 = ctypes.c_void_p, ctypes.c_int64
    for symbol in DTYPES.values():
        function = getattr(library, symbol)
        function.argtypes = [pointer] * 4 + [int64] + [pointer] * 3 + [int64] * 6 + [ctypes.c_float] * 2
        function.argtypes += [ctypes.c_int]
        function.restype = ctypes.c_int
    return library


@dataclass
class KernelRows:
    """A step's decode rows (one new token each) as the kernel reads them: built once per step, used by every layer."""

    rows: torch.Tensor | None
    """[B] row of each decoding sequence's token in the flattened step; None when every row of the step decodes."""
    table: torch.Tensor
    """[B, N] each row's block ids (N: the most any of them spans; the rest padded with 0, never read)."""
    lengths: torch.Tensor
    """[B] context length of each row (cached positions, this step's token included)."""
    firsts: dict[int | None, torch.Tensor]
    """Sliding window (None: none) -> [B] first position each row sees; filled as layers ask."""

    @classmethod
    def of(cls, decodes: list[DecodeRow], every_row: bool, device: torch.device) -> KernelRows:
        """From (row in the step, context length, block ids) of each decoding sequence."""
        batch = decode_batch(decodes, device)  # the padded tables batched SDPA gathers by, read here in place
        return cls(
            rows=None if every_row else batch.rows,
            table=batch.table.view(len(batch), -1),
            lengths=batch.lengths,
            firsts={},
        )

    def __len__(self) -> int:
        return self.lengths.numel()

    def first(self, window: int | None) -> torch.Tensor:
        """[B] first visible position of each row: 0, or with a window its oldest key still in it."""
        if window not in self.firsts:
            lo = torch.zeros_like(self.lengths) if window is None else (self.lengths - window).clamp(min=0)
            self.firsts[window] = lo
        return self.firsts[window]
