"""The on-disk cache of baseline outputs, so rerunning `gate check` after changing only the candidate is faster.

Entries live under `$SERVEGATE_CACHE` (default `.servegate-cache/`), keyed by the baseline's fingerprint
plus the identity of its weight files, and the suite's hash (its declaration plus the items' content).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

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


CACHE_FORMAT = 1
"""Bumped when the cached record layout changes (older entries are then ignored)."""


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


def weights_stamp(served: ServedModel) -> str:
    """Cheap identity of the weight files (names, sizes, mtimes) so a retrained checkpoint misses the cache.

    The fingerprint covers weights only through declared sha256 checksums; this covers the rest.
    """
    directory = weights_dir(served)
    if directory is None:
        return served.weights.source
    digest = hashlib.sha256(served.weights.source.encode())
    for path in sorted(directory.rglob("*")):
        if path.is_file() and _changes_outputs(path):
            stat = path.stat()
            digest.update(f"{path.relative_to(directory)}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def cache_key(served: ServedModel) -> str:
    """The cache key of a manifest's outputs: its fingerprint plus the identity of its weight files."""
    return hashlib.sha256(f"{served.fingerprint}:{weights_stamp(served)}".encode()).hexdigest()


def cache_dir() -> Path:
    """`$SERVEGATE_CACHE`, or `.servegate-cache/` in the working directory."""
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)


class OutputCache:
    """Outputs of one (fingerprint, suite) pair as JSON files, written atomically."""

    def __init__(self, directory: Path | None = None, enabled: bool = True) -> None:
        self.directory = directory if directory is not None else cache_dir()
        self.enabled = enabled
        self.hits = 0
        self.misses = 0

    def path(self, fingerprint: str, data: SuiteData) -> Path:
        """Where the outputs of `data` under the manifest with `fingerprint` are kept."""
        return self.directory / "outputs" / f"{fingerprint[:32]}-{data.name}-{data.digest[:16]}.json"

    def load(self, fingerprint: str, data: SuiteData) -> list[ItemOutput] | None:
        """Cached outputs, or None when absent, stale or unreadable."""
        if not self.enabled:
            return None
        path = self.path(fingerprint, data)
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.misses += 1
            return None
        if record.get("format") != CACHE_FORMAT or record.get("digest") != data.digest:
            self.misses += 1
            return None
        self.hits += 1
        return [ItemOutput.from_dict(o) for o in record["outputs"]]

    def store(self, fingerprint: str, data: SuiteData, outputs: Sequence[ItemOutput]) -> None:
        """Write outputs atomically (tmp + replace): a crash never leaves half an entry."""
        if not self.enabled:
            return
        path = self.path(fingerprint, data)
        record = {
            "format": CACHE_FORMAT,
            "fingerprint": fingerprint,
            "suite": data.name,
            "digest": data.digest,
            "outputs": [asdict(o) for o in outputs],
        }
        write_atomic(path, json.dumps(record))
