"""What the reference engine needs of each part it is made of, as Protocols.

A toy runner and tokenizer in a test and the manifest's real model satisfy the same types, so the engine
is typed against what it calls, not against torch or transformers classes it never imports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from servegate.runtime.types import SamplingParams

Sampler = Callable[[Any, list[SamplingParams], list[Any]], tuple[Any, Any]]
"""sample_batch(logits [B, vocab], params, generators) -> (token ids [B], logprobs [B] or None when no row asks)."""


class Embedder(Protocol):
    """An encoder model with its pooling (`task: embed`, model/embedding.py)."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text."""

    def tokenize(self, text: str) -> tuple[list[int], int]:
        """The tokens a text becomes after the manifest's truncation, and how many were dropped."""
