"""What the reference engine needs of each part it is made of, as Protocols.

A toy runner and tokenizer in a test and the manifest's real model satisfy the same types, so the engine
is typed against what it calls, not against torch or transformers classes it never imports.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from servegate.runtime.engine.interface import GenerationRequest, SamplingParams

Sampler = Callable[[Any, list[SamplingParams], list[Any]], tuple[Any, Any]]
"""sample_batch(logits [B, vocab], params, generators) -> (token ids [B], logprobs [B])."""


class EncodedPromptLike(Protocol):
    """A request's prompt as model input (preprocess.EncodedPrompt)."""

    @property
    def token_ids(self) -> Sequence[int]:
        """Prompt tokens after the chat template and the truncation policy."""

    @property
    def truncated_tokens(self) -> int:
        """Prompt tokens the truncation policy dropped."""


class PromptEncoder(Protocol):
    """Turns a request into prompt tokens as the manifest says (preprocess.Preprocessor)."""

    def encode(self, request: GenerationRequest) -> EncodedPromptLike:
        """The request's prompt tokens (raises ServingError for a request the manifest refuses)."""


class Embedder(Protocol):
    """An encoder model with its pooling (`task: embed`, model/embedding.py)."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text."""

    def tokenize(self, text: str) -> tuple[list[int], int]:
        """The tokens a text becomes after the manifest's truncation, and how many were dropped."""
