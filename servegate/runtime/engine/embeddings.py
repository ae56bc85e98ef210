"""`task: embed` on the reference engine: vectors from its encoder model, and the tokens an input becomes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.engine.parts import EngineParts


async def embed_texts(served: ServedModel, parts: EngineParts | None, texts: Sequence[str]) -> list[list[float]]:
    """One vector per text (invalid_request for an engine that generates text)."""
    if served.preprocess.task != "embed" or parts is None or parts.embedder is None:
        raise ServingError("invalid_request", detail="this model generates text; it serves no embeddings")
    vectors = await asyncio.to_thread(parts.embedder.embed, list(texts))
    return [list(map(float, v)) for v in vectors]


def embedding_tokens(parts: EngineParts | None, text: str) -> int:
    """Tokens an embedding input becomes (after the manifest's truncation), for the response's usage."""
    embedder = parts.embedder if parts is not None else None
    return len(embedder.tokenize(text)[0]) if embedder is not None else 0
