"""The decode rows of a paged step gathered into one padded batch, so a layer attends them in one SDPA call.

A decode row is a sequence with exactly one new token. For B of them the step builds, once, a padded
block table [B, N] (N: the most blocks any of them spans; shorter tables padded with block 0) and a key
mask [B, 1, 1, L] (L: the longest context; True = visible). Every layer then

1. gathers the B tables' blocks of its K and V pools with one `index_select` each, into the cache's
   reusable workspace, read as [B, kv_heads, L, head_dim] (a strided view, no second copy), and
2. runs one attention call over all B rows, the query heads sharing a KV head folded in as that head's
   query rows (q [B, kv_heads, Hq / kv_heads, head_dim]), K/V never repeated.

Masked keys (padding, and keys a sliding window has left behind) get zero weight, so every row attends
exactly its own context and its greedy token does not depend on the rest of the batch
(tests/runtime/test_model_runner.py). The price is the copy: contexts in consecutive blocks, which a
per-sequence call reads in place, are copied too (measured in benchmarks/README.md, "Batched decode
attention"). The workspace holds one layer's contexts of the rows; past WORKSPACE_BYTES the rows are split
into several batches, one call each, so that long contexts at large batch cannot take unplanned memory.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

WORKSPACE_BYTES = 256 * 2**20
"""Most bytes of gathered K and V (storage format) one batched call reads; more rows make more calls."""

DecodeRow = tuple[int, int, list[int]]
"""One decoding sequence: (its row in the flattened step, its context length, the ids of the blocks holding it)."""


@dataclass
class DecodeBatch:
    """Decode rows attended in one call: which rows they are and where their contexts live (built once per step)."""

    rows: torch.Tensor
    """[B] row of each decoding sequence's token in the flattened step."""
    table: torch.Tensor
    """[B * N] the padded block tables, flattened (the gather's index, `PagedKVCache.gather`)."""
    lengths: torch.Tensor
    """[B] context length of each (cached positions, this step's token included)."""
    width: int
    """Keys per row after trimming the padding past the longest context."""
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.rows.numel()

    def mask(self, window: int | None) -> torch.Tensor:
        """[B, 1, 1, width] keys each row sees (True = visible): its context, or with a window its last `window`."""
        if window not in self.masks:
            keys = torch.arange(self.width, device=self.lengths.device)[None, :]
            visible = keys < self.lengths[:, None]
            if window is not None:
                visible &= keys >= self.lengths[:, None] - window
            self.masks[window] = visible[:, None, None, :]
        return self.masks[window]

    def padded(self, gathered: torch.Tensor, head_dim: int) -> torch.Tensor:
        """The gathered blocks [kv_heads, B * N, block_size * head_dim] as [B, kv_heads, width, head_dim] (a view)."""
        return gathered.view(gathered.shape[0], len(self), -1, head_dim).transpose(0, 1)[:, :, : self.width]


def decode_batches(rows: list[DecodeRow], block_bytes: int, device: torch.device) -> list[DecodeBatch]:
    """The decode rows in batches whose padded contexts take at most WORKSPACE_BYTES (`block_bytes` per block)."""
    groups: list[list[DecodeRow]] = [[]]
    most = 0
    for row in rows:
        blocks = len(row[2])
        if groups[-1] and (len(groups[-1]) + 1) * max(most, blocks) * block_bytes > WORKSPACE_BYTES:
            groups.append([])
            most = 0
        groups[-1].append(row)
        most = max(most, blocks)
    return [decode_batch(group, device) for group in groups if group]


def decode_batch(rows: list[DecodeRow], device: torch.device) -> DecodeBatch:
    """One DecodeBatch of `rows`: their step rows, padded block tables and context lengths as tensors."""
    most = max(len(blocks) for _, _, blocks in rows)
    table = [b for _, _, blocks in rows for b in blocks + [0] * (most - len(blocks))]  # block 0 pads, masked out
    return DecodeBatch(
        rows=torch.tensor([row for row, _, _ in rows], dtype=torch.long, device=device),
        table=torch.tensor(table, dtype=torch.long, device=device),
        lengths=torch.tensor([length for _, length, _ in rows], dtype=torch.long, device=device),
        width=max(length for _, length, _ in rows),
    )
