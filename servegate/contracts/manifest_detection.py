"""Which YAML or JSON files are servegate manifests, for tools handed every changed file (the pre-commit hook
`gate validate --manifests-only`).

A file is a manifest when its top level is a mapping and
- it declares `kind: ServedModel` or an `apiVersion: servegate/...`, or
- it has a `weights:` mapping with a `source` (a minimal manifest need declare nothing else), or
- its `include:` names a file that is a manifest by these rules (followed through includes, a cycle ending it).
Any other file (a CI file, a suite, a config of another tool, a fragment meant only for inclusion) is not, and
`manifest_file_problem` says why in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

KIND = "ServedModel"
API_PREFIX = "servegate/"


def _top_level(path: Path) -> dict[str, Any] | str:
    """The file's top-level mapping, or why it has none."""
    try:
        data = YAML(typ="safe").load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({type(exc).__name__})"
    except YAMLError:
        return "does not parse as YAML or JSON"
    if not isinstance(data, dict):
        return "its top level is not a mapping"
    return data


def manifest_file_problem(path: Path, _seen: frozenset[Path] = frozenset()) -> str | None:
    """None when `path` is a servegate manifest by the rules above, else why it is not (one phrase)."""
    data = _top_level(path)
    if isinstance(data, str):
        return data
    if data.get("kind") == KIND or str(data.get("apiVersion", "")).startswith(API_PREFIX):
        return None
    weights = data.get("weights")
    if isinstance(weights, dict) and "source" in weights:
        return None
    include = data.get("include")
    names = [include] if isinstance(include, str) else include if isinstance(include, list) else []
    seen = _seen | {path.resolve()}
    for name in names:
        target = path.parent / str(name)
        if target.resolve() not in seen and target.is_file() and manifest_file_problem(target, seen) is None:
            return None
    return f"no kind: {KIND}, apiVersion: {API_PREFIX}..., weights.source or include: of a manifest"
