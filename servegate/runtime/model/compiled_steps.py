"""Every step of two or more sequences through one graph compiled with dynamic shapes (`runtime.compile: steps`).

`compile: decode` (compiled_decode.py) builds one static graph per batch size with inductor's C++ GEMM template,
which streams a weight matrix fastest at 1-6 sequences but falls behind oneDNN's packed kernels from about 32 on.
This mode compiles the runner's whole forward once, with the token count and the number of sequences symbolic:
inductor's default mode with the weights frozen, so its weight prepacking hands each product to oneDNN/MKL packed
kernels (what `cpu_linear: onednn` does eagerly), and every small op between the products (norms, rotary,
residuals, activations) is fused into a few C++ kernels. Sibling products that read the same input (q/k/v, and the
MLP's gate/up) are concatenated into one product at freezing (inductor's `cpp.enable_concat_linear`), as the eager
oneDNN route fuses them (fused_linear.py): 4 products a Llama layer instead of 7. Prefills, decode steps and mixed
steps of any size then run the same graph; paged attention stays the opaque custom op of compiled_decode.py. Rotary
cos/sin come from a table of every position the KV pool can hold (rotary_table.py).

Measured on the 2-core AMD EPYC VM with the 134M benchmark Llama (benchmarks/README.md): float32 decode steps
0.85-0.91x and prefills 0.86-0.96x of the eager oneDNN steps at 8-64 sequences with the same greedy tokens; one
sequence 1.11x (slower), which is why a step of one sequence runs eagerly here. Concatenating the siblings, measured
on a 2-core Intel Xeon VM with AMX (benchmarks/concat_linear.py: both graphs in one process, alternating): a bfloat16
prefill step of 512 tokens 0.81x (0.61-0.99x per round), decode steps at 64 sequences and float32 unchanged.

Shape classes. Dynamo specialises sizes 0 and 1 and gives equal sizes one symbol, so a step of one sequence,
a step whose token count equals its number of sequences (decode), and one with more tokens (prefill, mixed) are
different graphs. The two of two or more sequences are compiled at start-up; afterwards recompiling is refused
(the step runs eagerly and `fallbacks` counts it) so that a request never waits for the compiler.
"""

from __future__ import annotations

from typing import Any

import torch

from servegate.runtime.model.compiled_decode import CompiledForward, compile_view
from servegate.runtime.model.rotary_table import table_rotary

MIN_SEQS = 2
"""The fewest sequences a step needs to run the graph; a step of one sequence is a shape class of its own
(see the module docstring), slower compiled than eager, and runs eagerly."""


class CompiledSteps(CompiledForward):
    """The model's forward compiled once, with dynamic shapes, for every step of MIN_SEQS or more sequences."""

    def __init__(self, model: Any, dtype: torch.dtype, positions: int) -> None:
        view = compile_view(model)
        # cos/sin gathered from a table of every position a sequence can reach (rotary_table.py), not recomputed
        # in each layer's fused kernel
        table_rotary(view, positions, dtype, next(model.parameters()).device)
        super().__init__(torch.compile(view, dynamic=True))
        # float32 needs no emulated casts; in 16-bit types they keep the graph's roundings nearer eager's
        self._emulate_casts = dtype in (torch.bfloat16, torch.float16)
        self.warm = False
        """Set once start-up compiled the shape classes; from then on a step never compiles."""

    def wants(self, num_seqs: int, num_tokens: int) -> bool:
        """Whether a step of `num_seqs` sequences runs the graph (any token count)."""
        return num_seqs >= MIN_SEQS

    def compile_options(self) -> dict[str, Any]:
        """Weights frozen, so inductor prepacks them for oneDNN/MKL once instead of on every product; sibling
        products on the same input packed as one (few output columns leave AMX and AVX-512 tiles half idle)."""
        return {
            "freezing": True,
            "emulate_precision_casts": self._emulate_casts,
            "cpp.enable_concat_linear": True,
        }

    def compiling(self, num_seqs: int) -> bool:
        """Only before `warm` is set (start-up)."""
        return not self.warm
