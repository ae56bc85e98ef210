"""`PagedModelRunner`: one model step over a ragged batch of sequence chunks, with paged KV.

The engine's scheduler decides which sequences run and which KV blocks they own; the runner turns
its `SeqChunk`s into one flattened forward pass of the Hugging Face model (see paged_attention.py)
and returns the next-token logits of every chunk.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from servegate.runtime.model.compiled_decode import CompiledDecode, CompiledForward, check_compile_support
from servegate.runtime.model.compiled_steps import MIN_SEQS, CompiledSteps
from servegate.runtime.model.decode_kernel import DecodeKernel
from servegate.runtime.model.kv_memory import DTYPE_BYTES, kv_dims_from_config, num_kv_blocks
from servegate.runtime.model.paged_attention import (
    ContextSource,
    PagedKVCache,
    PagedStep,
    SeqAttention,
    register_paged_attention,
)
from servegate.runtime.model.slot_runs import slot_runs
from servegate.runtime.types import SeqChunk

log = logging.getLogger("servegate.runtime")


def _text_config(config: Any) -> Any:
    """The language model's config (multimodal wrappers keep it in text_config)."""
    text = getattr(config, "get_text_config", None)
    return text() if callable(text) else config


def eos_ids_of(model: Any) -> frozenset[int]:
    """EOS token ids declared by the model's generation config, else its config."""
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    return frozenset()


class PagedModelRunner:
    """Runs a Hugging Face causal LM over paged KV blocks (implements `servegate.runtime.types.ModelRunner`).

    The model is switched to the `servegate_paged` attention implementation; outside `execute` it
    still runs `generate` as with SDPA.
    """

    def __init__(
        self,
        model: Any,
        *,
        num_blocks: int,
        block_size: int,
        kv_dtype: str = "auto",
        compile_batch_sizes: Sequence[int] = (),
        compile_steps: bool = False,
        batched_decode: bool = False,
        decode_kernel: DecodeKernel | None = None,
    ) -> None:
        """`compile_batch_sizes`: decode steps of these numbers of sequences run a graph compiled now
        (`runtime.compile: decode`, see compiled_decode.py); empty: every step runs eagerly.
        `compile_steps=True`: every step of two or more sequences runs one graph with dynamic shapes, compiled now
        (`runtime.compile: steps`, see compiled_steps.py); not with `compile_batch_sizes`.
        `batched_decode=True` attends all decode rows of a step in one call per layer (batched_decode.py); the
        default, one call per sequence, measured faster on CPU (see `PagedStep.batched_decode`).
        `decode_kernel`: decode rows go through the decode attention kernel instead (decode_kernel.py), one call
        per layer reading the contexts in place; where the kernel cannot take the model, SDPA as above."""
        config = _text_config(model.config)
        dims = kv_dims_from_config(config)
        if dims.mla_latent_dim is not None:
            raise ValueError("multi-head latent attention (kv_lora_rank) is not supported by the paged runner")
        model.set_attn_implementation(register_paged_attention())
        model.eval()
        self.model = model
        self.dims = dims
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_dtype = kv_dtype
        self.batched_decode = batched_decode
        self.decode_kernel = decode_kernel
        self.vocab_size: int = model.get_output_embeddings().weight.shape[0]
        self._input_vocab: int = model.get_input_embeddings().weight.shape[0]
        self.eos_token_ids: frozenset[int] = eos_ids_of(model)
        parameter = next(model.parameters())
        self.device = parameter.device
        self.dtype = _compute_dtype(model)
        self.cache = PagedKVCache(
            num_layers=dims.num_layers,
            num_blocks=num_blocks,
            block_size=block_size,
            kv_heads=dims.num_kv_heads,
            head_dim=dims.head_dim,
            dtype=self.dtype,
            device=self.device,
            kv_dtype=kv_dtype,
        )
        self.compiled: CompiledForward | None = None
        if compile_batch_sizes and compile_steps:
            raise ValueError("compile_batch_sizes and compile_steps are two compile modes: choose one")
        if compile_batch_sizes:
            self._compile(compile_batch_sizes)
        if compile_steps:
            self._compile_steps()

    def _compile(self, batch_sizes: Sequence[int]) -> None:
        """Compile the decode graph of each batch size now, on a throwaway step (start-up, not a request)."""
        check_compile_support(self.device, quantized=_has_quantized_linear(self.model))
        too_big = [size for size in batch_sizes if size > self.num_blocks]
        if too_big:
            raise ValueError(f"compile_batch_sizes {too_big}: the KV pool has only {self.num_blocks} blocks")
        self.compiled = CompiledDecode(self.model, batch_sizes, self.dtype)
        for size in sorted(batch_sizes):
            began = time.perf_counter()
            log.info("runtime.compile: compiling the decode graph for %d sequence(s) (torch inductor)", size)
            # one token per sequence at position 0 of its own block: blocks no request owns yet (start-up),
            # whose contents are overwritten before anything reads them
            self.execute([SeqChunk(i, (0,), 0, (i,)) for i in range(size)])
            if self.compiled.runs.get(size) != 1:
                raise RuntimeError(f"the decode graph for {size} sequence(s) did not compile (see the log)")
            seconds = time.perf_counter() - began
            log.info("runtime.compile: decode graph for %d sequence(s) ready in %.1f s", size, seconds)

    def _compile_steps(self) -> None:
        """Compile the dynamic-shape graph's two shape classes now, on throwaway steps (start-up, not a request):
        a prefill of MIN_SEQS sequences with more tokens than sequences, then a decode step of them."""
        check_compile_support(self.device, quantized=_has_quantized_linear(self.model))
        per_seq = -(-2 // self.block_size)  # blocks for a sequence's first two positions
        if self.num_blocks < MIN_SEQS * per_seq:
            raise ValueError(
                f"compile: steps needs {MIN_SEQS * per_seq} KV blocks at start-up; the pool has only {self.num_blocks}"
            )
        steps = CompiledSteps(self.model, self.dtype, self.num_blocks * self.block_size)
        self.compiled = steps
        tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(MIN_SEQS)]
        began = time.perf_counter()
        log.info("runtime.compile: compiling one graph for every step of %d+ sequences (torch inductor)", MIN_SEQS)
        # blocks no request owns yet (start-up), whose contents are overwritten before anything reads them
        self.execute(
            [SeqChunk(0, (0, 0), 0, tables[0])] + [SeqChunk(i, (0,), 0, tables[i]) for i in range(1, MIN_SEQS)]
        )
        self.execute([SeqChunk(i, (0,), 1, tables[i]) for i in range(MIN_SEQS)])
        if steps.runs.get(MIN_SEQS) != 2:
            raise RuntimeError("the compiled steps' graph did not compile (see the log)")
        steps.warm = True
        log.info("runtime.compile: steps graph ready in %.1f s", time.perf_counter() - began)

    @classmethod
    def from_budget(
        cls,
        model: Any,
        memory_budget: int,
        block_size: int,
        kv_dtype: str = "auto",
        compile_batch_sizes: Sequence[int] = (),
    ) -> PagedModelRunner:
        """A runner with as many blocks as `memory_budget` bytes hold (the sizing capacity/ uses too)."""
        per_token = bytes_per_token_of(model, kv_dtype)
        blocks = num_kv_blocks(memory_budget, block_size, per_token)
        if blocks < 1:
            raise ValueError(
                f"kv_cache.memory_budget of {memory_budget} bytes holds no block of {block_size} tokens "
                f"({per_token} bytes per token): raise memory_budget or lower block_size"
            )
        return cls(
            model, num_blocks=blocks, block_size=block_size, kv_dtype=kv_dtype, compile_batch_sizes=compile_batch_sizes
        )

    def bytes_per_token(self) -> int:
        """KV bytes one token occupies across all layers in this runner's storage format."""
        return bytes_per_token_of(self.model, self.kv_dtype)

    # --- one step -------------------------------------------------------------------------------

    @torch.inference_mode()
    def execute(self, chunks: Sequence[SeqChunk]) -> torch.Tensor:
        """Write the chunks' KV into their blocks; float32 logits [len(chunks), vocab] at each chunk's last token."""
        if not chunks:
            return torch.empty(0, self.vocab_size, device=self.device)
        step, inputs = self._prepare(chunks)
        if self.compiled is not None and self.compiled.wants(len(chunks), inputs["input_ids"].shape[1]):
            out = self.compiled.run(step, **inputs)
            if out is not None:
                return out.logits[0].float()
        out = self.model(**inputs, paged_step=step)
        return out.logits[0].float()

    def _prepare(self, chunks: Sequence[SeqChunk]) -> tuple[PagedStep, dict[str, Any]]:
        """Flatten the chunks: the PagedStep and the model's forward arguments (input_ids [1, T], position_ids
        [1, T], the last token of each chunk as logits_to_keep [B])."""
        bs, device = self.block_size, self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        last: list[int] = []
        seqs: list[SeqAttention] = []
        for chunk in chunks:
            n, start = len(chunk.token_ids), chunk.start_pos
            end = start + n
            blocks = (end + bs - 1) // bs
            table = chunk.block_table[:blocks]
            if n < 1 or start < 0:
                raise ValueError(f"sequence {chunk.seq_id}: a chunk needs >= 1 token and start_pos >= 0")
            if len(table) < blocks:
                raise ValueError(
                    f"sequence {chunk.seq_id}: {len(chunk.block_table)} blocks of {bs} tokens cannot hold "
                    f"positions up to {end}"
                )
            if min(table) < 0 or max(table) >= self.num_blocks:
                raise ValueError(f"sequence {chunk.seq_id}: block id outside 0..{self.num_blocks - 1} in {table}")
            begin = len(ids)
            ids.extend(chunk.token_ids)
            positions.extend(range(start, end))
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, end))
            last.append(begin + n - 1)
            if table[-1] - table[0] == blocks - 1 and all(b == table[0] + i for i, b in enumerate(table)):
                source = ContextSource(end, table[0] * bs, None)
            else:
                source = ContextSource(end, None, torch.tensor(table, dtype=torch.long, device=device))
            seqs.append(SeqAttention(begin, begin + n, start, source))
        if ids and (min(ids) < 0 or max(ids) >= self._input_vocab):
            raise ValueError(f"token id outside the model's vocabulary 0..{self._input_vocab - 1}")
        slot_mapping = torch.tensor(slots, dtype=torch.long, device=device)
        runs = slot_runs(slots)
        step = PagedStep(self.cache, slot_mapping, seqs, self.batched_decode, self.decode_kernel, runs=runs)
        input_ids = torch.tensor([ids], dtype=torch.long, device=device)
        inputs = {
            "input_ids": input_ids,
            # no padding in the flattened step; an explicit all-ones mask also spares transformers from
            # building a [T, T] packed-sequence mask that paged attention would not read anyway
            "attention_mask": torch.ones_like(input_ids),
            "position_ids": torch.tensor([positions], dtype=torch.long, device=device),
            "use_cache": False,
            "logits_to_keep": torch.tensor(last, dtype=torch.long, device=device),
        }
        return step, inputs


def _compute_dtype(model: Any) -> torch.dtype:
    """The floating dtype activations run in (the first floating parameter's; quantized weights are skipped)."""
    dtype = getattr(model, "dtype", None)
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    for parameter in model.parameters():
        if parameter.dtype.is_floating_point:
            return parameter.dtype
    return torch.float32


def _has_quantized_linear(model: Any) -> bool:
    """Whether any linear weight is a quantized tensor subclass rather than a plain tensor."""
    return any(isinstance(m, torch.nn.Linear) and type(m.weight.data) is not torch.Tensor for m in model.modules())


def bytes_per_token_of(model: Any, kv_dtype: str = "auto") -> int:
    """KV bytes per token of `model` stored as `kv_dtype` (auto: the compute dtype)."""
    dims = kv_dims_from_config(_text_config(model.config))
    if kv_dtype == "fp8":
        element = DTYPE_BYTES["fp8"]
    else:
        element = _compute_dtype(model).itemsize
    return dims.bytes_per_token(element)
