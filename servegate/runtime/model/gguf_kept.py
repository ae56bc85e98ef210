"""What servegate derives from a GGUF file, derived once per file and kept.

The gguf package and transformers read a GGUF in pure Python. Each read parses the whole header (for SmolLM2,
about 49,000 vocabulary strings and 49,000 merges, element by element), and a load dequantizes every tensor with
numpy. A load of the zoo's SmolLM2 Q4_1 file parsed its header three times (scheme, config, weights) and a fourth
for the tokenizer: 20.7 s on two cores, against 2.7 s for its kept conversion (benchmarks/gguf_load.py). A `gate
check` of a GGUF build loads it in several gates, and each start of a llama.cpp manifest's bench reads its tokenizer.

So each thing derived from a file is kept under `$SERVEGATE_HOME/gguf/<key>/<part>`:
- `header`: the header's scalar and string keys, the count of each tensor type and the tensors' bytes (JSON);
- `config`: transformers' config for the file (JSON);
- `tokenizer`: transformers' tokenizer for the file, saved as a folder;
- `checkpoint`: every tensor dequantized to float32, saved as safetensors with its config and tokenizer, the folder
  the reference runtime loads.

The key is the sha256 of the file's bytes and the versions of gguf, transformers and torch: a rebuilt file, or
another converter, derives again. A part is written to a temporary folder beside it and renamed into place, so a
crash leaves no half part, and of two processes deriving the same part one copy stays. Delete
`$SERVEGATE_HOME/gguf` to reclaim the disk: the checkpoint part is the size of the float32 model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError
from servegate.contracts.home import make_kept_folder, servegate_home

KEPT_DIR = "gguf"
"""The folder under $SERVEGATE_HOME that holds the kept parts."""
_KEYS: dict[tuple[str, int, int], str] = {}  # (resolved path, size, mtime) -> key: one hash per file per process


@dataclass(frozen=True)
class GgufFields:
    """A GGUF header's metadata, as kept."""

    values: dict[str, Any]
    """Every scalar and string key of the header (arrays, such as the vocabulary, are left out)."""
    tensor_types: dict[str, int]
    """How many tensors have each type (Q4_1, F32, ...)."""
    tensor_bytes: int
    """Bytes of all tensors as stored in the file (what llama.cpp maps)."""
    linear_bytes: int
    """Bytes of the matrices a decode step multiplies, as stored: each block's 2-D weights and the output head
    (the token embedding when the head is tied to it)."""

    def get(self, key: str) -> Any:
        """The value of `key`, or None when the header does not have it."""
        return self.values.get(key)

    def file_type_name(self) -> str | None:
        """`general.file_type` by name (Q4_1, Q8_0, Q4_K_M), or None when the header does not say."""
        file_type = self.values.get("general.file_type")
        if file_type is None:
            return None
        import gguf

        try:
            return str(gguf.LlamaFileType(file_type).name).removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"file type {file_type}"


def kept_root() -> Path:
    """Where the derived parts live: $SERVEGATE_HOME/gguf (default ~/.cache/servegate/gguf)."""
    return servegate_home() / KEPT_DIR


def gguf_key(path: Path) -> str:
    """The key of a GGUF file's kept parts: its bytes' sha256 and the deriving libraries' versions."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if memo not in _KEYS:
        from importlib.metadata import version

        from servegate.zoo.catalog import sha256_file

        versions = ",".join(f"{pkg}={version(pkg)}" for pkg in ("gguf", "transformers", "torch"))
        _KEYS[memo] = hashlib.sha256(f"{sha256_file(path)}|{versions}".encode()).hexdigest()[:32]
    return _KEYS[memo]


def gguf_fields(path: Path) -> GgufFields:
    """The header of `path`; a ServegateError when it is missing or not a GGUF file."""
    if not path.is_file():
        raise ServegateError(f"weights: no GGUF file at {path}")
    kept = _kept(path, "header", lambda out: _write_json(out / "header.json", _read_header(path)))
    data = json.loads((kept / "header.json").read_text(encoding="utf-8"))
    return GgufFields(
        values=data["values"],
        tensor_types=data["tensor_types"],
        tensor_bytes=data["tensor_bytes"],
        linear_bytes=data["linear_bytes"],
    )


def gguf_config(path: Path) -> dict[str, Any]:
    """transformers' config for the model in `path`, as a dict."""

    def derive(out: Path) -> None:
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
        except (OSError, ValueError, KeyError) as exc:
            raise ServegateError(f"{path}: no model config in its header ({str(exc).splitlines()[0]})") from None
        _write_json(out / "config.json", config.to_dict())

    return dict(json.loads((_kept(path, "config", derive) / "config.json").read_text(encoding="utf-8")))


def gguf_tokenizer_dir(path: Path) -> Path:
    """A folder holding the tokenizer `path` carries, saved by transformers (AutoTokenizer loads it)."""

    def derive(out: Path) -> None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True).save_pretrained(out)

    return _kept(path, "tokenizer", derive)


def gguf_checkpoint_dir(path: Path) -> Path:
    """A folder holding `path` dequantized to float32 safetensors, with its config and tokenizer."""
    from servegate.zoo.fetch import convert_gguf

    return _kept(path, "checkpoint", lambda out: convert_gguf(path, out), announce=True)


def keep_conversion(path: Path, converted: Path, names: list[str]) -> Path:
    """Take the files `names` of `converted`, a folder the same converter already wrote `path`'s conversion into
    (the zoo's SmolLM2), as `path`'s kept checkpoint: hard-linked (copied across file systems), so the file is not
    dequantized a second time and its 517 MiB are not stored twice."""

    def derive(out: Path) -> None:
        for name in names:
            try:
                os.link(converted / name, out / name)
            except OSError:
                shutil.copy2(converted / name, out / name)

    return _kept(path, "checkpoint", derive)


def _kept(path: Path, part: str, derive: Callable[[Path], None], announce: bool = False) -> Path:
    """The kept folder of `part` for `path`, derived into a temporary sibling and renamed into place first when
    it is not there yet."""
    folder = kept_root() / gguf_key(path) / part
    if folder.is_dir():
        return folder
    make_kept_folder(folder.parent, f"what is read from {path.name}")
    if announce:  # minutes on a slow machine: say what is happening and where it goes
        print(f"servegate: converting {path.name} to float32 safetensors once, kept in {folder}", file=sys.stderr)
    scratch = folder.parent / f".{part}-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        derive(scratch)
        try:
            scratch.rename(folder)  # atomic on one file system: the part appears whole or not at all
        except OSError:
            if not folder.is_dir():  # not another process's copy landing first: a real failure
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _read_header(path: Path) -> dict[str, Any]:
    """The scalar and string keys of a GGUF header and its tensor type counts, with the gguf package's reader."""
    try:
        import gguf
    except ImportError:
        raise ServegateError(f"reading {path.name} needs the gguf package: pip install 'servegate[real]'") from None
    try:
        reader = gguf.GGUFReader(path)
    except (OSError, ValueError) as exc:
        raise ServegateError(f"{path} is not a GGUF file servegate can read ({exc})") from None
    values: dict[str, Any] = {}
    for key, found in reader.fields.items():
        if not found.data or not found.types or found.types[0].name == "ARRAY":
            continue
        value = found.parts[found.data[0]]
        if found.types[0].name == "STRING":
            values[key] = bytes(value).decode("utf-8", errors="replace")
        else:
            values[key] = value.tolist()[0] if hasattr(value, "tolist") else value
    counts: dict[str, int] = {}
    stored: dict[str, int] = {}
    linear = 0
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
        stored[tensor.name] = int(tensor.n_bytes)
        if tensor.name == "output.weight" or (tensor.name.startswith("blk.") and len(tensor.shape) == 2):
            linear += int(tensor.n_bytes)
    if "output.weight" not in stored:  # a tied head: the logits multiply the token embedding
        linear += stored.get("token_embd.weight", 0)
    return {"values": values, "tensor_types": counts, "tensor_bytes": sum(stored.values()), "linear_bytes": linear}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True, default=str) + "\n", encoding="utf-8")
