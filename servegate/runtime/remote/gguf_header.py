"""What a GGUF file's header says about the model llama.cpp will run: architecture, trained context, KV shape.

Read with the `gguf` package's reader (a memory map: the tensors are not loaded), for the llama.cpp mapping
(runtime/remote/llamacpp_args.py): a context past the trained length, and the KV bytes a context costs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError


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
    try:
        import gguf
    except ImportError:
        raise ServegateError(f"reading {path.name} needs the gguf package: pip install 'servegate[real]'") from None
    if not path.is_file():
        raise ServegateError(f"weights: no GGUF file at {path}")
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ServegateError(f"{path} is not a GGUF file ({exc})") from None
    arch = _field(reader, "general.architecture")
    prefix = str(arch) if arch else "llama"
    heads, kv_heads = (
        _field(reader, f"{prefix}.attention.head_count"),
        _field(reader, f"{prefix}.attention.head_count_kv"),
    )
    width, key_length = _field(reader, f"{prefix}.embedding_length"), _field(reader, f"{prefix}.attention.key_length")
    head_size = key_length or (width // heads if width and heads else None)
    file_type = _field(reader, "general.file_type")
    return GgufHeader(
        path=path,
        architecture=str(arch) if arch else None,
        context_length=_int(_field(reader, f"{prefix}.context_length")),
        layers=_int(_field(reader, f"{prefix}.block_count")),
        kv_width=int((kv_heads or heads) * head_size) if head_size and (kv_heads or heads) else None,
        file_type=_type_name(gguf, file_type) if file_type is not None else None,
        chat_template="tokenizer.chat_template" in reader.fields,
    )


def _int(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) else None


def _field(reader: Any, key: str) -> Any:
    """A scalar or string metadata value of the header, or None."""
    found = reader.fields.get(key)
    if found is None or not found.data:
        return None
    value = found.parts[found.data[0]]
    if found.types and found.types[0].name == "STRING":
        return bytes(value).decode("utf-8", errors="replace")
    return value.tolist()[0] if hasattr(value, "tolist") else value


def _type_name(gguf: Any, file_type: int) -> str:
    try:
        return str(gguf.LlamaFileType(file_type).name).removeprefix("MOSTLY_").removeprefix("ALL_")
    except ValueError:
        return f"file type {file_type}"
