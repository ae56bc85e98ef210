"""Greedy completions of a causal LM with plain ``model.generate``, and exact-match scoring.

This is the measurement behind the datasheet and the zoo tests: left-padded batches, greedy
decoding, completions cut at ``<eos>``. The runtime has its own engine; this stays deliberately
plain so the datasheet does not depend on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from servegate.zoo.tasks import MAX_NEW_TOKENS


@torch.inference_mode()
def greedy_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    batch_size: int = 64,
    max_new_tokens: int = MAX_NEW_TOKENS,
    max_input_tokens: int | None = None,
    truncation: str = "left",
) -> list[str]:
    """Greedy completion of each prompt (special tokens removed), optionally truncated.

    With ``max_input_tokens``, prompts longer than that keep their last (``truncation="left"``)
    or first (``"right"``) tokens, ``<bos>`` counted like any other token.
    """
    if truncation not in ("left", "right"):
        raise ValueError(f"truncation must be 'left' or 'right' (got {truncation!r})")
    # Sorting by length keeps padding small; the order is restored at the end.
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    by_index: dict[int, str] = {}
    for start in range(0, len(order), batch_size):
        chunk = order[start : start + batch_size]
        rows = [tokenizer(prompts[i])["input_ids"] for i in chunk]
        if max_input_tokens is not None:
            rows = [row[-max_input_tokens:] if truncation == "left" else row[:max_input_tokens] for row in rows]
        width = max(len(row) for row in rows)
        ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, width - len(row) :] = torch.tensor(row)
            mask[r, width - len(row) :] = 1
        # transformers' stubs resolve `generate` through nn.Module.__getattr__ (a Tensor), not GenerationMixin
        out = model.generate(  # type: ignore[operator]
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        for i, row in zip(chunk, out[:, width:].tolist(), strict=True):
            by_index[i] = cast(str, tokenizer.decode(row, skip_special_tokens=True))  # one row decodes to one str
    return [by_index[i] for i in range(len(prompts))]


def exact_match_rate(predictions: Sequence[str], references: Sequence[str]) -> float:
    """Share of predictions equal to their reference, character for character."""
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not references:
        return 0.0
    return sum(p == r for p, r in zip(predictions, references, strict=True)) / len(references)
