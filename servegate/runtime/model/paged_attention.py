"""Paged attention for any Hugging Face decoder, plugged in through `transformers.AttentionInterface`.

The model's own modeling code runs unchanged; only its attention call is ours. One step feeds the
model a ragged batch flattened into one sequence of T tokens (input_ids [1, T] with explicit
position_ids), and a `PagedStep` rides along in the forward kwargs down to every attention call.
Per layer the attention function

1. writes the T new K/V rows into their slots of the preallocated block pool (`PagedKVCache`),
2. attends each sequence's new tokens over its context (cached prefix + new tokens), causally: one SDPA
   call per sequence, or with `batched_decode` all decode rows (one new token each) in one call. With a
   `decode_kernel` (decode_kernel.py, the runtime's default on CPU) every decode row goes through that kernel
   instead, one call per layer that reads each context where its blocks lie; what follows describes SDPA.

A slot is `block_id * block_size + offset`. Each layer's pool is head-major, [kv_heads, slots,
head_dim], so a sequence whose blocks are consecutive is a strided view of the pool that SDPA reads
in place: no copy of the history. Other sequences have their blocks gathered into a small reusable
workspace, one sequence at a time, so the copy stays in cache. With `batched_decode` the decode rows of a
step are instead gathered, one `index_select` of their padded block tables per pool, into a workspace
[B, kv_heads, L, head_dim] and attended under a key-padding mask: one call per layer instead of one per
sequence (384 -> 12 at batch 32 on a 12-layer model), and ~2,860 instead of ~14,170 ops a step.

What that costs, measured on the 2-core AMD EPYC VM (benchmarks/README.md, "Batched decode attention":
fp32, 2 threads, 134M Llama, 128-token prompts, lightly loaded): the copy. Per-sequence calls read
consecutive blocks in place, and a call costs only ~0.06 ms when the machine is not oversubscribed, so at
batch 32 the padded gather (~29 ms a step) costs more than the calls and small ops it saves (~4 ms): over
consecutive blocks the batched step took 154 vs 132 ms at batch 32 and 234 vs 192 ms at batch 64 (equal at
batch 8). Over scattered blocks, which the per-sequence path gathers too, the two tie (144 vs 150 ms at batch
32, 270 vs 266 at 64). So on an idle CPU per-sequence reading still beats one padded batched gather, by
~20%, not several times. What the one call buys is the fewer parallel regions and eager ops above, the
costs that multiply when other work shares the cores; whether that wins on a loaded machine is not yet
measured. So the per-sequence path is the default, and `batched_decode=True` the measured alternative.

Without a `PagedStep` in the kwargs the function is plain SDPA, so a model switched to it still runs
`model.generate` exactly as before; inside a compiled decode graph (compiled_decode.py) it is the
opaque `servegate::paged_attention` op, which runs this same code on the step being executed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from servegate.runtime.model.batched_decode import DecodeBatch, DecodeRow, decode_batches
from servegate.runtime.model.decode_kernel import DecodeKernel, KernelRows, kernel_takes
from servegate.runtime.model.huge_pages import huge_page_zeros, wants_huge_pages
from servegate.runtime.model.slot_runs import SlotRun

ATTENTION_NAME = "servegate_paged"
"""The name our attention (and mask) function is registered under; pass it as `attn_implementation`."""

KV_DTYPES = ("auto", "fp8")
"""KV storage formats: `auto` stores the compute dtype, `fp8` stores float8_e4m3fn (decoded on read)."""


def _pool(shape: tuple[int, int, int], dtype: torch.dtype, device: torch.device | str, huge: bool) -> torch.Tensor:
    """One layer's zeroed K or V pool: with `huge` (a large CPU cache, huge_pages.wants_huge_pages) on 2 MiB pages,
    where a step's scattered block reads miss the TLB far less; else plain zeros."""
    return huge_page_zeros(shape, dtype) if huge else torch.zeros(shape, dtype=dtype, device=device)


class PagedKVCache:
    """Preallocated K and V pools of every layer, each [kv_heads, num_blocks * block_size, head_dim].

    With `kv_dtype="fp8"` the pools hold float8_e4m3fn bytes (as uint8, since CPU index ops lack fp8)
    and every read converts back to the compute dtype: KV round-tripped through fp8, 1 byte per element.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        kv_dtype: str = "auto",
    ) -> None:
        if kv_dtype not in KV_DTYPES:
            raise ValueError(f"kv_dtype must be one of {KV_DTYPES} (got {kv_dtype!r})")
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1 (got {num_blocks}, {block_size})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.dtype = dtype
        self.fp8 = kv_dtype == "fp8"
        self.storage_dtype = torch.uint8 if self.fp8 else dtype
        shape = (kv_heads, num_blocks * block_size, head_dim)
        huge = wants_huge_pages(2 * num_layers * math.prod(shape) * self.storage_dtype.itemsize, device)
        self.keys = [_pool(shape, self.storage_dtype, device, huge) for _ in range(num_layers)]
        self.values = [_pool(shape, self.storage_dtype, device, huge) for _ in range(num_layers)]
        # gather target for sequences whose blocks are not consecutive; grown on demand, reused by every layer
        self._workspace = torch.empty(0, dtype=self.storage_dtype, device=device)

    def nbytes(self) -> int:
        """Bytes held by all K and V pools."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x in the storage format."""
        return x.to(torch.float8_e4m3fn).view(torch.uint8) if self.fp8 else x.to(self.dtype)

    def decode(self, x: torch.Tensor) -> torch.Tensor:
        """Stored rows back in the compute dtype."""
        return x.view(torch.float8_e4m3fn).to(self.dtype) if self.fp8 else x

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """x as the pool would return it (fp8-rounded under fp8 storage, else x itself)."""
        return self.decode(self.encode(x)) if self.fp8 else x

    def write(
        self,
        layer: int,
        slots: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        runs: list[SlotRun] | None = None,
    ) -> None:
        """Store new rows: slots [T], key/value [kv_heads, T, head_dim]; `runs` (slot_runs.py) the same slots as
        consecutive stretches, copied as slices."""
        pool = self.keys[layer]
        if key.shape[0] != pool.shape[0] or key.shape[2] != pool.shape[2]:
            raise ValueError(
                f"layer {layer} produced K/V with {key.shape[0]} heads of {key.shape[2]} but the pool holds "
                f"{pool.shape[0]} heads of {pool.shape[2]}: the config's head counts do not match the model"
            )
        for stored, rows in ((pool, self.encode(key)), (self.values[layer], self.encode(value))):
            if runs is None:
                stored.index_copy_(1, slots, rows)
                continue
            for slot, row, length in runs:
                stored[:, slot : slot + length].copy_(rows[:, row : row + length])

    def reserve(self, blocks: int) -> None:
        """Make the gather workspace hold `blocks` blocks of K and of V."""
        need = 2 * self.kv_heads * blocks * self.block_size * self.head_dim
        if self._workspace.numel() < need:
            self._workspace = torch.empty(need, dtype=self.storage_dtype, device=self._workspace.device)

    def gather(self, layer: int, blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Blocks `blocks` [N] of the layer's K and V copied into the workspace (valid until the next gather),
        each [kv_heads, N, block_size * head_dim] in the storage format."""
        heads, width = self.kv_heads, self.block_size * self.head_dim
        self.reserve(blocks.numel())
        n = heads * blocks.numel() * width
        k_out = self._workspace[:n].view(heads, -1, width)
        v_out = self._workspace[n : 2 * n].view(heads, -1, width)
        torch.index_select(self.keys[layer].view(heads, -1, width), 1, blocks, out=k_out)
        torch.index_select(self.values[layer].view(heads, -1, width), 1, blocks, out=v_out)
        return k_out, v_out

    def context(self, layer: int, source: ContextSource, lo: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions lo .. source.length - 1 of one sequence, each [1, kv_heads, length - lo, head_dim]."""
        if source.run_start is not None:  # consecutive blocks: a view of the pool
            start = source.run_start
            k = self.keys[layer][:, start + lo : start + source.length]
            v = self.values[layer][:, start + lo : start + source.length]
        else:
            assert source.blocks is not None
            k_out, v_out = self.gather(layer, source.blocks)
            k = k_out.view(self.kv_heads, -1, self.head_dim)[:, lo : source.length]
            v = v_out.view(self.kv_heads, -1, self.head_dim)[:, lo : source.length]
        return self.decode(k).unsqueeze(0), self.decode(v).unsqueeze(0)


@dataclass
class ContextSource:
    """Where one sequence's cached context lives in the pool."""

    length: int
    """Positions 0 .. length - 1 are cached (after this step's write)."""
    run_start: int | None
    """First slot when the context's blocks are consecutive (read as a view), else None."""
    blocks: torch.Tensor | None
    """[ceil(length / block_size)] block ids to gather when they are not consecutive."""

    def block_ids(self, block_size: int) -> list[int]:
        """Ids of the blocks holding positions 0 .. length - 1."""
        if self.run_start is not None:
            first = self.run_start // block_size
            return list(range(first, first + -(-self.length // block_size)))
        assert self.blocks is not None
        return self.blocks.tolist()

    def first_visible(self, window: int | None) -> int:
        """First position a query at the last position sees: 0, or with a sliding window its oldest key."""
        return 0 if window is None else max(0, self.length - window)


@dataclass
class SeqAttention:
    """One sequence's part of a step: its new tokens and where its context lives."""

    begin: int
    """First row of its new tokens in the flattened step."""
    end: int
    """One past its last row."""
    start_pos: int
    """Tokens of the sequence cached before this step."""
    source: ContextSource
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None, device: torch.device) -> torch.Tensor:
        """[n, length] causal mask (query i sits at start_pos + i; True = visible), optionally sliding-window."""
        if window not in self.masks:
            n, total = self.end - self.begin, self.source.length
            keys = torch.arange(total, device=device)[None, :]
            queries = torch.arange(self.start_pos, self.start_pos + n, device=device)[:, None]
            visible = keys <= queries
            if window is not None:
                visible &= keys > queries - window
            self.masks[window] = visible
        return self.masks[window]


@dataclass
class PagedStep:
    """Everything the attention calls of one forward pass share (built once per step, used by every layer)."""

    cache: PagedKVCache
    slot_mapping: torch.Tensor
    """[T] slot each new token's K/V is written to."""
    seqs: list[SeqAttention]
    """The sequences of the step, in the order of their rows."""
    batched_decode: bool = False
    """Attend the step's decode rows in one call per layer (batched_decode.py); False (the default, measured
    faster on CPU: module notes): one call per sequence, reading consecutive blocks in place."""
    decode_kernel: DecodeKernel | None = None
    """Attend the step's decode rows with the decode attention kernel (decode_kernel.py): one call per layer for
    all of them, each context read where its blocks lie. Takes precedence over `batched_decode`; None: SDPA."""
    kernel_rows: KernelRows | None = field(init=False, default=None)
    """The decode rows the kernel attends (None when there is no kernel, none decode, or it cannot take them)."""
    decode_batches: list[DecodeBatch] = field(init=False, default_factory=list)
    """The decode rows gathered together (one batch unless their contexts outgrow WORKSPACE_BYTES); empty when
    per-sequence, or fewer than two sequences decode."""
    lone_decode: tuple[int, int] | None = field(init=False, default=None)
    """(first slot, context length) when the step is one sequence decoding one token over consecutive blocks."""
    runs: list[SlotRun] | None = None
    """`slot_mapping` as stretches of consecutive slots (slot_runs.py), written as slices; None: index_copy_."""

    def __post_init__(self) -> None:
        cache, kernel = self.cache, self.decode_kernel
        device = self.slot_mapping.device
        use_kernel = kernel is not None and not cache.fp8 and kernel_takes(cache.dtype, device, cache.head_dim)
        decodes = [s for s in self.seqs if s.end - s.begin == 1] if use_kernel or self.batched_decode else []
        rows: list[DecodeRow] = [(s.begin, s.source.length, s.source.block_ids(cache.block_size)) for s in decodes]
        if use_kernel and rows:  # every decode row, a lone one too: a sequence's bits then never depend on its batch
            self.kernel_rows = KernelRows.of(rows, len(rows) == len(self.seqs), device)
            return
        if len(self.seqs) == 1 and not cache.fp8:
            seq = self.seqs[0]
            if seq.end - seq.begin == 1 and seq.source.run_start is not None:
                self.lone_decode = (seq.source.run_start, seq.source.length)
        if len(rows) > 1:
            block_bytes = 2 * cache.kv_heads * cache.block_size * cache.head_dim * cache.keys[0].element_size()
            self.decode_batches = decode_batches(rows, block_bytes, device)

    def attend(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        window: int | None,
        softcap: float | None,
    ) -> torch.Tensor:
        """query [1, Hq, T, D], key/value [1, Hkv, T, D] -> attention output [1, T, Hq, D]."""
        cache = self.cache
        pool = cache.keys[layer]
        if (
            self.lone_decode is not None
            and softcap is None
            # K/V the pool would have to convert, or cannot take (cache.write says why), take the general path
            and (key.shape[1], key.shape[3], key.dtype) == (pool.shape[0], pool.shape[2], pool.dtype)
        ):
            return self._attend_lone_decode(layer, query, key, value, scaling, window)
        num_heads, head_dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
        cache.write(layer, self.slot_mapping, key[0], value[0], self.runs)
        rows = query[0].transpose(0, 1)  # [T, Hq, D]
        decoded: list[torch.Tensor] = []
        if self.kernel_rows is not None and query.dtype == pool.dtype:
            out = self._attend_kernel(layer, rows, scaling, window, softcap)
            if self.kernel_rows.rows is None:  # every row decodes
                return out.unsqueeze(0)
            decoded = list(out.split(1))[::-1]  # [1, Hq, D] each, popped in row order
        elif self.decode_batches:
            every_row_decodes = len(self.seqs) == query.shape[2]
            for batch in self.decode_batches:
                # one call for the batch's rows; the query heads sharing a KV head become that head's query rows
                one = every_row_decodes and len(self.decode_batches) == 1
                q = (rows if one else rows.index_select(0, batch.rows)).reshape(len(batch), kv_heads, -1, head_dim)
                k, v = (cache.decode(batch.padded(t, head_dim)) for t in cache.gather(layer, batch.table))
                decoded.append(attend(q, k, v, batch.mask(window), scaling, softcap).reshape(-1, num_heads, head_dim))
            if every_row_decodes:
                return (decoded[0] if len(decoded) == 1 else torch.cat(decoded)).unsqueeze(0)
            decoded = list(torch.cat(decoded).split(1))[::-1]  # [1, Hq, D] each, popped in row order
        outs = []
        for seq in self.seqs:
            if seq.end - seq.begin == 1:
                if decoded:
                    outs.append(decoded.pop())
                    continue
                # one call per sequence: the query heads sharing a KV head become that head's query rows
                q = rows[seq.begin].reshape(1, kv_heads, num_heads // kv_heads, head_dim)
                k, v = cache.context(layer, seq.source, seq.source.first_visible(window))
                outs.append(attend(q, k, v, None, scaling, softcap).reshape(1, num_heads, head_dim))
                continue
            q = query[:, :, seq.begin : seq.end]  # [1, Hq, n, D]
            if seq.start_pos == 0 and window is None:
                # nothing cached before it: its own new K/V with a plain causal mask, no read back
                k = cache.round_trip(key[:, :, seq.begin : seq.end])
                v = cache.round_trip(value[:, :, seq.begin : seq.end])
                o = attend(q, k, v, None, scaling, softcap, causal=True)
            else:
                k, v = cache.context(layer, seq.source)
                o = attend(q, k, v, seq.mask(window, q.device), scaling, softcap)
            outs.append(o[0].transpose(0, 1))
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.unsqueeze(0)

    def _attend_kernel(
        self, layer: int, rows: torch.Tensor, scaling: float | None, window: int | None, softcap: float | None
    ) -> torch.Tensor:
        """The decode rows' attention through the kernel: rows [T, Hq, D] -> [B, Hq, D] for the B decode rows."""
        found, kernel = self.kernel_rows, self.decode_kernel
        assert found is not None and kernel is not None  # attend() calls this only when both are set
        cache = self.cache
        num_heads, head_dim = rows.shape[1], rows.shape[2]
        q = rows if found.rows is None else rows.index_select(0, found.rows)
        # the query heads sharing a KV head are consecutive (transformers' GQA): [B, kv_heads, Hq / kv_heads, D]
        q = q.reshape(len(found), cache.kv_heads, num_heads // cache.kv_heads, head_dim)
        scale = scaling if scaling is not None else head_dim**-0.5
        out = kernel.attend(
            q, cache.keys[layer], cache.values[layer], found.table, found.lengths, found.first(window),
            cache.block_size, scale, softcap,
        )  # fmt: skip
        return out.view(len(found), num_heads, head_dim)

    def _attend_lone_decode(
        self,
        layer: int,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        scaling: float | None,
        window: int | None,
    ) -> torch.Tensor:
        """attend() for a batch-1 decode step: the same SDPA call on the same views, with the fewest ops.

        Batch-1 decode is bound by the weights streaming through, and every eager op here is paid once per
        layer per token: the general path's bookkeeping cost ~3x the attention itself (benchmarks/README.md).
        """
        keys, values = self.cache.keys[layer], self.cache.values[layer]
        num_heads, head_dim, kv_heads = query.shape[1], query.shape[3], key.shape[1]
        keys.index_copy_(1, self.slot_mapping, key[0])
        values.index_copy_(1, self.slot_mapping, value[0])
        start, length = self.lone_decode  # type: ignore[misc]  # attend() calls this only when it is set
        lo = start + self.seqs[0].source.first_visible(window)
        # the query heads sharing a KV head become that head's query rows, K/V never repeated
        q = query.reshape(1, kv_heads, num_heads // kv_heads, head_dim)
        out = F.scaled_dot_product_attention(
            q, keys[None, :, lo : start + length], values[None, :, lo : start + length], scale=scaling
        )
        return out.reshape(1, 1, num_heads, head_dim)


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float | None,
    softcap: float | None,
    *,
    causal: bool = False,
) -> torch.Tensor:
    """Scaled dot-product attention, q [B, Hq, n, D], k/v [B, Hkv, L, D], Hq a multiple of Hkv; mask True = visible."""
    if softcap is None:
        gqa = q.shape[1] != k.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scaling, enable_gqa=gqa)
    # logit soft-capping (Gemma 2) is not in SDPA: the explicit form
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = (q @ k.transpose(-1, -2)) * (scaling if scaling is not None else q.shape[-1] ** -0.5)
    scores = torch.tanh(scores / softcap) * softcap
    if causal:
        n, length = q.shape[-2], k.shape[-2]
        mask = torch.ones(n, length, dtype=torch.bool, device=q.device).tril(length - n)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v


def paged_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """The function transformers calls for every attention layer (the AttentionInterface signature).

    With a `paged_step` kwarg: paged attention over our KV pool (the mask transformers built is unused,
    the step knows each sequence's context). Without: transformers' own SDPA attention.
    """
    step: PagedStep | None = kwargs.pop("paged_step", None)
    window = kwargs.get("sliding_window")
    if step is None and torch.compiler.is_compiling() and query.device.type == "cpu":
        # a compiled decode graph (compiled_decode.py): attention is an opaque op over the step being run
        out = torch.ops.servegate.paged_attention(
            query, key, value, module.layer_idx, scaling, window, kwargs.get("softcap")
        )
        return out, None
    if step is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"paged attention takes one flattened sequence per step (got batch {query.shape[0]})")
    # transformers' attention modules hold an int layer_idx; nn.Module types undeclared attributes as Tensor | Module
    out = step.attend(module.layer_idx, query, key, value, scaling, window, kwargs.get("softcap"))  # type: ignore[arg-type]
    return out, None


def register_paged_attention() -> str:
    """Register the attention and mask functions under ATTENTION_NAME (idempotent); returns the name."""
    AttentionInterface.register(ATTENTION_NAME, paged_attention_forward)
    # transformers' SDPA mask keeps plain `generate` correct; paged steps ignore the mask it builds
    AttentionMaskInterface.register(ATTENTION_NAME, sdpa_mask)
    return ATTENTION_NAME
