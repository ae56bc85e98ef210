"""What a GGUF file's header says about the model llama.cpp will run: architecture, trained context, KV shape.

Read with the `gguf` package's reader (a memory map: the tensors are not loaded) once per file and kept
(runtime/model/gguf_kept.py), for the llama.cpp mapping (runtime/remote/llamacpp_args.py): a context past the
trained length, and the KV bytes a context costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.runtime.model.gguf_kept import gguf_fields


@dataclass(frozen=True)
class GgufHeader:
    """The header keys the llama.cpp mapping needs (None where the file does not say)."""

    path: Path
    """The .gguf file."""
    architecture: str | None
    """`general.architecture`, e.g. `llama`."""
    context_length: int | None
    """`<arch>.context_length`: the context the model was trained with, tokens."""
    layers: int | None
    """`<arch>.block_count`."""
    kv_width: int | None
    """Key (= value) width per token per layer: KV heads x head size, elements."""
    file_type: str | None
    """`general.file_type` by name, e.g. `Q4_1`, `Q8_0`."""
    chat_template: bool
    """Whether the file carries a chat template (`tokenizer.chat_template`)."""

    def kv_bytes(self, tokens: int, bytes_per_element: float) -> int | None:
        """Bytes of keys and values for `tokens` cached tokens at `bytes_per_element`, None when unknown."""
        if self.layers is None or self.kv_width is None:
            return None
        return int(2 * self.layers * self.kv_width * tokens * bytes_per_element)


def read_gguf_header(path: Path) -> GgufHeader:
    """The header of `path`; a ServegateError when it is missing or not a GGUF file."""
    fields = gguf_fields(path)
    arch = fields.get("general.architecture")
    prefix = str(arch) if arch else "llama"
    heads, kv_heads = fields.get(f"{prefix}.attention.head_count"), fields.get(f"{prefix}.attention.head_count_kv")
    width, key_length = fields.get(f"{prefix}.embedding_length"), fields.get(f"{prefix}.attention.key_length")
    head_size = key_length or (width // heads if width and heads else None)
    return GgufHeader(
        path=path,
        architecture=str(arch) if arch else None,
        context_length=_int(fields.get(f"{prefix}.context_length")),
        layers=_int(fields.get(f"{prefix}.block_count")),
        kv_width=int((kv_heads or heads) * head_size) if head_size and (kv_heads or heads) else None,
        file_type=fields.file_type_name(),
        chat_template="tokenizer.chat_template" in fields.values,
    )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None
