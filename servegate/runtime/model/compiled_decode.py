"""Decode steps through a graph compiled by torch inductor (`runtime.compile: decode`).

A decode step at small batch is a matrix-vector product over every weight plus a few hundred small
eager ops (norms, rotary, residuals) that each pay Python and dispatcher overhead, with the caches
just flushed by the weights streaming through. Compiled, the small ops fuse into a few C++ kernels,
and with the weights frozen into the graph inductor's own C++ GEMM template (chosen by autotuning)
streams a float32 weight matrix at close to copy bandwidth: on the 2-core AMD EPYC VM the 85 products
of the benchmark Llama read 18.4-20.1 GB/s against 14.9-16.7 for OpenBLAS and 9.7-10.6 for torch's MKL
(benchmarks/README.md).

Paged attention stays opaque to the compiler: it is a custom op (`servegate::paged_attention`) whose
body is the eager `PagedStep.attend` of the step being run, so the context length, the block tables
and the number of cached tokens never reach the graph's guards. The graph is specialised to a number
of sequences (`runtime.compile_batch_sizes`); each is compiled once at start-up, and a step of another
shape, or a prefill, runs eagerly as before. Recompiling while serving is refused (the step then runs
eagerly) so that a request never waits for the compiler.

Costs: a C++ compiler at start-up, start-up time (about a minute per batch size for a 134M model on
2 cores), and a copy of the linear weights per graph, which the frozen graph holds in its own layout.

The graphs are compiled over their own view of the model (`compile_view`), so the eager steps' linears can be
routed afterwards (`runtime.cpu_linear: onednn`) without touching what the graphs' guards check. That pairs the two
kernels where each is faster: on the 2-core AMD EPYC VM (benchmarks/README.md) a compiled float32 decode step of
the 134M Llama took 12-25 ms at 1-6 sequences against 26-34 ms through oneDNN, about the same at 8, while at 32-64
sequences oneDNN's steps were 1.5-1.7x faster than the compiled ones.
"""

from __future__ import annotations

import abc
import copy
import logging
import shutil
import threading
from collections.abc import Sequence
from typing import Any

import torch

from servegate.contracts.errors import ServegateError
from servegate.runtime.model.paged_attention import PagedStep

log = logging.getLogger("servegate.runtime")


class _CurrentStep(threading.local):
    """The PagedStep of the compiled call running on this thread (read by the custom op's body)."""

    step: PagedStep | None = None


_current = _CurrentStep()


# Defined through torch.library.Library rather than the custom_op decorator: that decorator's wrapper cost
# ~25 us more per call (measured on the 2-core VM), paid by every layer of every compiled step.
# The op mutates no argument (it writes the KV pool, which the graph never sees) and returns a new tensor.
_library = torch.library.Library("servegate", "FRAGMENT")
_library.define(
    "paged_attention(Tensor query, Tensor key, Tensor value, int layer, float? scaling, int? window, "
    "float? softcap) -> Tensor"
)


def paged_attention_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layer: int,
    scaling: float | None,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """Paged attention of the current step's layer `layer`: query [1, Hq, T, D] -> [1, T, Hq, D]."""
    step = _current.step
    if step is None:
        raise RuntimeError("servegate::paged_attention called outside a compiled paged step")
    # the graph was compiled against the fake's contiguous layout (below), so the result must have it
    return step.attend(layer, query, key, value, scaling, window, softcap).contiguous()


_library.impl("paged_attention", paged_attention_op, "CPU")


@torch.library.register_fake("servegate::paged_attention")
def _paged_attention_shape(query: torch.Tensor, *_other_arguments: object) -> torch.Tensor:
    """What the compiler sees: a [1, T, Hq, D] tensor of the query's dtype."""
    return query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])


def check_compile_support(device: torch.device, quantized: bool) -> None:
    """Refuse, with what to do, a setup `runtime.compile` (decode or steps) cannot run on."""
    if device.type != "cpu":
        raise ServegateError(f"runtime.compile is implemented for CPU (the model runs on {device}): set compile: off")
    if quantized:
        raise ServegateError(
            "runtime.compile freezes float weights into its graphs; it does not take quantized "
            "weights: set runtime.quantization.method: none or compile: off"
        )
    if shutil.which("g++") is None and shutil.which("c++") is None:
        raise ServegateError(
            "runtime.compile needs a C++ compiler for torch inductor's kernels (none on PATH): "
            "install one (Debian: apt-get install g++) or set compile: off"
        )


def compile_view(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model`'s module tree sharing every tensor, where each linear layer's parameters are new Parameter
    objects over the same data.

    Compiled graphs guard on the parameters they were traced with. Routing the eager model's linears afterwards
    (onednn_linear.py swaps each weight's data for a placeholder and replaces the layer's forward) would fail those
    guards and send every step back to the eager path; over this view it changes nothing the graphs see. The view
    keeps the dense linear weights alive after the eager model releases them."""
    memo: dict[int, Any] = {}
    for module in model.modules():
        for parameter in module.parameters(recurse=False):
            if id(parameter) not in memo:
                linear = isinstance(module, torch.nn.Linear)
                memo[id(parameter)] = (
                    torch.nn.Parameter(parameter.data, requires_grad=parameter.requires_grad) if linear else parameter
                )
        for buffer in module.buffers(recurse=False):
            memo[id(buffer)] = buffer
    return copy.deepcopy(model, memo)


class CompiledForward(abc.ABC):
    """A compiled forward of the paged runner and its counters; each compile mode says which steps it takes,
    with which inductor settings, and when it may still compile."""

    def __init__(self, forward: Any) -> None:
        self._forward = forward
        """The torch.compile'd forward (compile_view of the model), built by the mode."""
        self.runs: dict[int, int] = {}
        """Compiled steps run so far, per number of sequences (a size absent here is not compiled yet)."""
        self.fallbacks = 0
        """Steps of a compiled shape that ran eagerly because the graph would have had to recompile."""

    @abc.abstractmethod
    def wants(self, num_seqs: int, num_tokens: int) -> bool:
        """Whether a step of `num_seqs` sequences and `num_tokens` tokens runs the graph."""

    @abc.abstractmethod
    def compile_options(self) -> dict[str, Any]:
        """Inductor settings the graph is built with."""

    @abc.abstractmethod
    def compiling(self, num_seqs: int) -> bool:
        """Whether a step of `num_seqs` sequences may compile now (start-up) rather than run a graph built before."""

    def run(self, step: PagedStep, **inputs: Any) -> Any | None:
        """The model's output for one step, or None when the graph would have to recompile (run it eagerly)."""
        import torch._inductor.config as inductor_config

        num_seqs = len(step.seqs)
        _current.step = step
        try:
            if self.compiling(num_seqs):  # start-up: compile this shape now, with the freezing options
                with inductor_config.patch(self.compile_options()):
                    out = self._forward(**inputs)
            else:
                with torch.compiler.set_stance("fail_on_recompile"):
                    out = self._forward(**inputs)
            self.runs[num_seqs] = self.runs.get(num_seqs, 0) + 1
            return out
        except RuntimeError as exc:
            if "recompil" not in str(exc).lower():
                raise
            self.fallbacks += 1
            if self.fallbacks == 1:
                log.warning("a compiled graph would recompile (%s); running such steps eagerly", exc)
            return None
        finally:
            _current.step = None


class CompiledDecode(CompiledForward):
    """The model's forward compiled for decode steps of the given numbers of sequences, one static graph each."""

    def __init__(self, model: Any, batch_sizes: Sequence[int], dtype: torch.dtype) -> None:
        super().__init__(torch.compile(compile_view(model), dynamic=False, mode="max-autotune-no-cudagraphs"))
        self.batch_sizes = frozenset(batch_sizes)
        # inductor's C++ GEMM template covers these; anything else (float64) keeps aten's kernels
        self._gemm_backends = "CPP" if dtype in (torch.float32, torch.bfloat16, torch.float16) else "ATEN"

    def wants(self, num_seqs: int, num_tokens: int) -> bool:
        """Whether a step of `num_seqs` sequences and `num_tokens` tokens is a compiled decode shape."""
        return num_tokens == num_seqs and num_seqs in self.batch_sizes

    def compile_options(self) -> dict[str, Any]:
        """Inductor settings the graph is built with: weights frozen, GEMMs from its C++ template."""
        return {"freezing": True, "max_autotune_gemm_backends": self._gemm_backends}

    def compiling(self, num_seqs: int) -> bool:
        """A size compiles on its first step (start-up warms each declared size)."""
        return num_seqs not in self.runs
