"""The memory side of a capacity plan: M_total = M_weights + M_runtime + N_active x M_request.

M_request is a sequence's KV cache at the planned context (rounded up to whole blocks), so the
number of sequences that fit follows from the memory left after weights and runtime overhead, and
the KV pool is sized by the same `num_kv_blocks` the runtime's block manager uses.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from servegate.capacity.memory.weights import WeightsMemory, read_config, weights_memory
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.sections import Runtime, auto_packs_for_onednn
from servegate.contracts.units import format_bytes
from servegate.runtime.model.kv_memory import DTYPE_BYTES, kv_dims_from_config, num_kv_blocks


@dataclass(frozen=True)
class MemoryPlan:
    """Where the memory goes and how many sequences fit."""

    weights_bytes: int
    """Bytes held by the weights (quantization and scales included)."""
    parameters: int
    """Parameter count."""
    runtime_overhead_bytes: int
    """Activations, logits and allocator slack of one step, in bytes."""
    runtime_overhead_source: str
    """`declared` (capacity.runtime_overhead), `measured` (gate profile) or `estimated` (from the config)."""
    kv_bytes_per_token: int
    """KV-cache bytes one token occupies across all layers."""
    kv_dtype: str
    """Element type the KV cache is stored in."""
    block_size: int
    """Tokens per KV block."""
    kv_pool_bytes: int
    """Bytes given to KV blocks."""
    num_kv_blocks: int
    """KV blocks in the pool."""
    context_tokens: int
    """Context length (prompt + output tokens) each sequence is sized for."""
    blocks_per_sequence: int
    """KV blocks one sequence at the planned context needs."""
    max_concurrent_sequences: int
    """Sequences at the planned context whose KV cache fits at once."""
    total_bytes: int
    """weights + runtime overhead + KV pool (+ a compiled graph's weights, + the fallback engine), in bytes."""
    budget_bytes: int | None = None
    """The total memory budget checked against (None: no budget declared)."""
    fallback_bytes: int = 0
    """Memory of the fallback manifest's engine (its weights, runtime overhead and KV pool), which runs in the
    same server process; 0 without a fallback."""
    compiled_weights_bytes: int = 0
    """The copies of the linear weights compiled decode graphs hold frozen in their own layout, one per graph, and
    the eager steps' packed copy beside them (`runtime.compile`, `compiled_weights_bytes()`); 0 when
    nothing is compiled."""
    rotary_table_bytes_per_token: int = 0
    """Bytes per slot of the KV pool of the rotary cos/sin table `runtime.compile: steps` holds
    (runtime/model/rotary_table.py: one row pair per slot, in the compute dtype); 0 when nothing is tabled."""
    modelled: bool = True
    """False when the engine's own processes hold memory this plan does not know (an engine servegate does not run
    and has not measured: planning/engine_memory.py): the total is then a partial sum, and no budget is judged."""
    not_modelled_reason: str = ""
    """Why not, when not modelled."""

    @property
    def fixed_bytes(self) -> int:
        """Everything that does not grow with the KV pool: weights, runtime overhead, the compiled graph's weights,
        the fallback."""
        return self.weights_bytes + self.runtime_overhead_bytes + self.compiled_weights_bytes + self.fallback_bytes

    @property
    def rotary_table_bytes(self) -> int:
        """The rotary table beside this plan's pool, in bytes (it grows with the pool)."""
        return self.num_kv_blocks * self.block_size * self.rotary_table_bytes_per_token

    def table_for(self, pool_bytes: int) -> int:
        """Bytes of the rotary table beside a KV pool of `pool_bytes` (one row pair per slot of its blocks)."""
        blocks = num_kv_blocks(pool_bytes, self.block_size, self.kv_bytes_per_token)
        return blocks * self.block_size * self.rotary_table_bytes_per_token

    def pool_within(self, total_bytes: int) -> int:
        """The largest KV pool that fits in `total_bytes` beside everything else, its rotary table included."""
        room = total_bytes - self.fixed_bytes
        return pool_in_room(room, self.block_size, self.kv_bytes_per_token, self.rotary_table_bytes_per_token)

    def with_kv_pool(self, pool_bytes: int) -> MemoryPlan:
        """The same plan with a KV pool of `pool_bytes`: its blocks, concurrent sequences and total follow."""
        blocks = num_kv_blocks(pool_bytes, self.block_size, self.kv_bytes_per_token)
        table = self.table_for(pool_bytes)
        return replace(
            self,
            kv_pool_bytes=pool_bytes,
            num_kv_blocks=blocks,
            max_concurrent_sequences=blocks // self.blocks_per_sequence,
            total_bytes=self.fixed_bytes + table + pool_bytes,
        )

    @property
    def fits(self) -> bool:
        """Whether the total stays within the budget (True when there is no budget, or nothing to judge it by: see
        `modelled`)."""
        return self.budget_bytes is None or not self.modelled or self.total_bytes <= self.budget_bytes

    @property
    def judged_bytes(self) -> int | None:
        """The total a memory target may be checked against (None when not modelled: a partial sum never meets
        a target)."""
        return self.total_bytes if self.modelled else None

    @property
    def shortfall_bytes(self) -> int | None:
        """Bytes the budget lacks to hold everything and one sequence at the planned context (0: none; None: no
        budget)."""
        if self.budget_bytes is None:
            return None
        one_sequence = self.blocks_per_sequence * self.block_size * self.kv_bytes_per_token
        pool = max(self.kv_pool_bytes, one_sequence)
        return max(0, self.fixed_bytes + pool + self.table_for(pool) - self.budget_bytes)

    def shortfall(self) -> str | None:
        """What the budget cannot hold and by how much, with the fix (None when the plan is feasible)."""
        short = self.shortfall_bytes
        if not short or self.budget_bytes is None or not self.modelled:
            return None
        held = f"the weights ({format_bytes(self.weights_bytes)}) and runtime overhead "
        held += f"({format_bytes(self.runtime_overhead_bytes)})"
        if self.compiled_weights_bytes:
            held += f", the compiled graph's weights ({format_bytes(self.compiled_weights_bytes)})"
        if self.fallback_bytes:
            held += f", the fallback engine ({format_bytes(self.fallback_bytes)})"
        if self.fixed_bytes <= self.budget_bytes:
            held += f" and one sequence of {self.context_tokens:,} tokens"
        return (
            f"the memory budget {format_bytes(self.budget_bytes)} does not hold {held}: it is "
            f"{format_bytes(short)} short; raise the budget or quantize the weights"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form, with the derived `fits` and `shortfall_bytes`."""
        fits = self.fits if self.modelled else None
        shortfall = self.shortfall_bytes if self.modelled else None
        return {
            **asdict(self),
            "rotary_table_bytes": self.rotary_table_bytes,
            "fits": fits,
            "shortfall_bytes": shortfall,
        }

    def lines(self) -> list[str]:
        """Human-readable summary, one fact per line, every number with its unit."""
        out = [
            f"weights: {format_bytes(self.weights_bytes)} ({self.parameters:,} parameters)",
            f"runtime overhead: {format_bytes(self.runtime_overhead_bytes)} ({self.runtime_overhead_source})",
            f"KV cache: {self.kv_bytes_per_token:,} bytes/token ({self.kv_dtype}), block {self.block_size} tokens",
            f"KV pool: {format_bytes(self.kv_pool_bytes)} = {self.num_kv_blocks:,} blocks",
            f"max concurrent sequences at {self.context_tokens:,} tokens: {self.max_concurrent_sequences:,}",
        ]
        if self.compiled_weights_bytes:
            out.append(f"compiled graphs (frozen weights): {format_bytes(self.compiled_weights_bytes)}")
        if self.rotary_table_bytes:
            slots = self.num_kv_blocks * self.block_size
            out.append(
                f"rotary table (compile: steps): {format_bytes(self.rotary_table_bytes)} for {slots:,} positions"
            )
        if self.fallback_bytes:
            out.append(f"fallback engine (same server): {format_bytes(self.fallback_bytes)}")
        if not self.modelled:
            out.append(
                f"total: not modelled - weights, KV pool and overhead sum to {format_bytes(self.total_bytes)}, a "
                f"partial sum ({self.not_modelled_reason})"
            )
            return out
        out += [
            f"total: {format_bytes(self.total_bytes)}"
            + (
                f" of a {format_bytes(self.budget_bytes)} budget ({'fits' if self.fits else 'DOES NOT FIT'})"
                if self.budget_bytes is not None
                else ""
            ),
        ]
        return out


def estimate_runtime_overhead(config: dict[str, Any], tokens_per_step: int, max_seqs: int, dtype: str) -> int:
    """Rough peak activation bytes of one step: hidden and MLP activations per token, fp32 logits per sequence."""
    hidden = int(config.get("hidden_size") or config.get("n_embd") or 0)
    inter = int(config.get("intermediate_size") or config.get("n_inner") or 4 * hidden)
    vocab = int(config.get("vocab_size") or 0)
    per_token = (4 * hidden + 2 * inter) * DTYPE_BYTES[dtype]
    return tokens_per_step * per_token + max_seqs * vocab * 4


def plan_memory(
    config: dict[str, Any],
    *,
    context_tokens: int,
    memory_budget: int | None = None,
    kv_pool_bytes: int | None = None,
    dtype: str = "float32",
    kv_dtype: str | None = None,
    quantization: str = "none",
    group_size: int = 32,
    block_size: int = 16,
    runtime_overhead: int | None = None,
    overhead_source: str = "declared",
    tokens_per_step: int = 2048,
    weights: WeightsMemory | None = None,
    fallback_bytes: int = 0,
    compiled_weights_bytes: int = 0,
    rotary_table_bytes_per_token: int = 0,
) -> MemoryPlan:
    """Size weights, overhead and KV pool for one model (plus `fallback_bytes` held by a fallback engine,
    `compiled_weights_bytes` by a compiled decode graph, and `rotary_table_bytes_per_token` for each slot of the
    pool by a compiled graph's rotary table).

    Give `kv_pool_bytes` to check a declared pool (the manifest's kv_cache.memory_budget); without it the
    pool is whatever `memory_budget` leaves after weights, overhead and the fallback (memory-only planning).
    """
    if context_tokens < 1:
        raise ValueError(f"context must be at least 1 token (got {context_tokens})")
    kv_dtype = kv_dtype or dtype
    weights = weights or weights_memory(config, dtype, quantization, group_size)
    per_token = kv_dims_from_config(config).bytes_per_token(DTYPE_BYTES[kv_dtype])
    if runtime_overhead is None:
        runtime_overhead = estimate_runtime_overhead(config, tokens_per_step, 1, dtype)
        overhead_source = "estimated"
    # everything that does not grow with the KV pool (MemoryPlan.fixed_bytes of the plan returned)
    fixed_bytes = weights.bytes + runtime_overhead + compiled_weights_bytes + fallback_bytes
    if kv_pool_bytes is None:
        if memory_budget is None:
            raise ValueError("give a memory budget or a KV pool size")
        # a budget that leaves no room for the KV pool is an infeasible plan: its shortfall_bytes says by how much
        kv_pool_bytes = pool_in_room(memory_budget - fixed_bytes, block_size, per_token, rotary_table_bytes_per_token)
    blocks = num_kv_blocks(kv_pool_bytes, block_size, per_token)
    table_bytes = blocks * block_size * rotary_table_bytes_per_token
    per_seq = -(-context_tokens // block_size)
    return MemoryPlan(
        weights_bytes=weights.bytes,
        parameters=weights.parameters,
        runtime_overhead_bytes=int(runtime_overhead),
        runtime_overhead_source=overhead_source,
        kv_bytes_per_token=per_token,
        kv_dtype=kv_dtype,
        block_size=block_size,
        kv_pool_bytes=int(kv_pool_bytes),
        num_kv_blocks=blocks,
        context_tokens=context_tokens,
        blocks_per_sequence=per_seq,
        max_concurrent_sequences=blocks // per_seq,
        total_bytes=int(fixed_bytes + table_bytes + kv_pool_bytes),
        budget_bytes=memory_budget,
        fallback_bytes=fallback_bytes,
        compiled_weights_bytes=compiled_weights_bytes,
        rotary_table_bytes_per_token=rotary_table_bytes_per_token,
    )


def pool_in_room(room_bytes: int, block_size: int, kv_per_token: int, table_per_token: int) -> int:
    """The KV pool that `room_bytes` holds (0 when none is left): all of it, or with a rotary table beside the pool,
    the whole blocks whose KV and table rows fit together."""
    if room_bytes <= 0:
        return 0
    if not table_per_token:
        return room_bytes
    return num_kv_blocks(room_bytes, block_size, kv_per_token + table_per_token) * block_size * kv_per_token


def model_config_path(served: ServedModel) -> Path:
    """Directory holding the manifest's config.json (zoo name, local directory or cached hub snapshot)."""
    source = served.weights.source
    if source.startswith("zoo:"):
        from servegate import zoo

        finder = getattr(zoo, "zoo_model_path", None)
        if finder is None:
            raise ServegateError(f"{source}: the zoo is not available in this install")
        return Path(finder(source[4:]))
    if source.startswith("hf:"):
        from huggingface_hub import hf_hub_download

        repo, _, revision = source[3:].partition("@")
        try:
            return Path(hf_hub_download(repo, "config.json", revision=revision or None)).parent
        except Exception as exc:  # offline and not cached: say what to do
            raise ServegateError(
                f"{source}: config.json is not available offline ({type(exc).__name__}); download the model "
                "and point weights.source at its folder"
            ) from None
    return served.resolve_path(source)


def manifest_config(served: ServedModel) -> dict[str, Any]:
    """The manifest's model config as a dict: its config.json, or for `weights.format: gguf` the config
    transformers derives from the GGUF's header (a GGUF folder has no config.json)."""
    if served.weights.format != "gguf":
        return read_config(model_config_path(served))
    from servegate.runtime.model.checkpoint_scheme import gguf_path
    from servegate.runtime.model.gguf_kept import gguf_config
    from servegate.runtime.model.weights import resolve_weights_dir

    return gguf_config(gguf_path(resolve_weights_dir(served), served.weights.gguf_file))


def compute_dtype(served: ServedModel) -> str:
    """The dtype the runtime computes in (`auto`: float32 on CPU, bfloat16 on CUDA)."""
    if served.runtime.dtype != "auto":
        return served.runtime.dtype
    device = served.runtime.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return "bfloat16" if device == "cuda" else "float32"


def manifest_memory(
    served: ServedModel,
    context_tokens: int | None = None,
    runtime_overhead: int | None = None,
    *,
    with_fallback: bool = True,
) -> MemoryPlan:
    """The memory plan of a manifest: its weights, its declared KV pool, its budget (capacity.targets.memory).

    The runtime overhead is the declared capacity.runtime_overhead, else `runtime_overhead` (measured by
    `gate profile`), else an estimate from the config. A declared fallback's engine runs in the same
    server, so its own plan's total (weights, overhead, KV pool) is added unless `with_fallback` is False.
    """
    config = manifest_config(served)
    dtype = compute_dtype(served)
    quant = served.runtime.quantization
    kv = served.runtime.kv_cache
    context = context_tokens or served.runtime.max_model_len
    source = "declared"
    overhead = served.capacity.runtime_overhead
    if overhead is None and runtime_overhead is not None:
        overhead, source = runtime_overhead, "measured"
    budget = served.capacity.targets.memory if served.capacity.targets else None
    weights = weights_memory(
        config, dtype, quant.method, quant.group_size, quant.include_lm_head, quant.include_embeddings
    )
    if served.runtime.backend == "llamacpp" and served.weights.format == "gguf":
        weights = _as_stored(served, weights)
    block_size = kv.block_size if kv else 16
    pool = kv.memory_budget if kv else None
    if pool is None:  # no paged pool: each running sequence holds its own contiguous cache
        per_token = kv_dims_from_config(config).bytes_per_token(DTYPE_BYTES[dtype])
        pool = served.batching.max_batch_size * -(-context // block_size) * block_size * per_token
    return plan_memory(
        config,
        context_tokens=context,
        memory_budget=budget,
        kv_pool_bytes=pool,
        dtype=dtype,
        block_size=block_size,
        runtime_overhead=overhead,
        overhead_source=source,
        tokens_per_step=served.batching.max_num_batched_tokens,
        weights=weights,
        fallback_bytes=_fallback_bytes(served) if with_fallback else 0,
        compiled_weights_bytes=compiled_weights_bytes(served.runtime, weights.linear_bytes, dtype),
        rotary_table_bytes_per_token=_rotary_table_per_token(served, config, dtype),
    )


def _rotary_table_per_token(served: ServedModel, config: dict[str, Any], dtype: str) -> int:
    """Bytes per KV slot of the rotary table `runtime.compile: steps` builds on servegate's own runtime, else 0."""
    if served.runtime.compile != "steps":  # the manifest allows compile on the reference backend only
        return 0
    from servegate.runtime.model.rotary_table import table_bytes_per_position

    return table_bytes_per_position(config, DTYPE_BYTES[dtype])


COMPILED_GRAPH_WEIGHT_COPIES = 2
"""Copies of the linear weights `gate plan` counts for each compiled graph. Measured on the 134M Llama
(benchmarks/compile_memory.py, benchmarks/README.md): the first decode graph grew the process by 1.6 (float32)
and 2.7 (bfloat16) copies, each further one by 2.0 and 1.2, and the eager steps' oneDNN pack by 0.2-1.0 more; the
one graph of `compile: steps` by 1.35 and 1.72, its eager steps' pack by 1.1. Two a graph and one for the pack is
at or above each measured total with the pack; without it, one bfloat16 decode graph measured 0.65 copies more
than counted."""


def compiled_weights_bytes(runtime: Runtime, linear_bytes: int, dtype: str) -> int:
    """The linear weights `runtime.compile` holds beyond the model's own: COMPILED_GRAPH_WEIGHT_COPIES per compiled
    graph (each freezes and packs its own: one per batch size for `decode`, one for `steps`), and one more where the
    eager steps beside the graphs route through oneDNN (`eager_steps_pack`), since the graphs keep the dense
    weights alive (runtime/model/compiled_decode.py). `dtype`: the compute dtype's name."""
    if runtime.compile == "off":
        return 0
    graphs = len(runtime.compile_batch_sizes) if runtime.compile == "decode" else 1
    return linear_bytes * (graphs * COMPILED_GRAPH_WEIGHT_COPIES + eager_steps_pack(runtime, dtype, linear_bytes))


def eager_steps_pack(runtime: Runtime, dtype: str, linear_bytes: int) -> bool:
    """Whether the eager steps beside compiled graphs hold oneDNN's packed copy of the linear weights: with
    `cpu_linear: onednn`, and with `auto` where `auto_packs_for_onednn` says so on CPU (the rule of
    runtime/model/cpu_linear.resolve_cpu_linear, which never picks OpenBLAS beside compiled graphs)."""
    if runtime.cpu_linear == "onednn":
        return True
    return runtime.cpu_linear == "auto" and runtime.device != "cuda" and auto_packs_for_onednn(dtype, linear_bytes)


def _as_stored(served: ServedModel, weights: WeightsMemory) -> WeightsMemory:
    """The weights of a GGUF llama.cpp serves: it maps the file's tensors as stored (Q8_0, Q4_K, ...), where the
    reference runtime dequantizes them to the compute dtype, which is what `weights` counted."""
    from servegate.runtime.model.checkpoint_scheme import gguf_path
    from servegate.runtime.model.gguf_kept import gguf_fields
    from servegate.runtime.model.weights import resolve_weights_dir

    fields = gguf_fields(gguf_path(resolve_weights_dir(served), served.weights.gguf_file))
    stored = fields.file_type_name() or "as stored"
    return replace(weights, bytes=fields.tensor_bytes, linear_bytes=fields.linear_bytes, quantization=f"gguf {stored}")


def _fallback_bytes(served: ServedModel) -> int:
    """Total memory of the fallback manifest's engine (0 without one)."""
    from servegate.contracts.loading import load_fallback

    fallback = load_fallback(served)
    # the server builds the fallback's engine without a fallback of its own (runtime.build): no chain to count
    return 0 if fallback is None else manifest_memory(fallback, with_fallback=False).total_bytes
