"""The zoo's eval suites and the loader that also takes users' own JSONL, CSV or parquet files.

Suites load through ``datasets.load_dataset`` like any user suite, so ``HF_HOME`` and the
datasets cache behave the same for both. Field meanings are in ``suite_generator``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from servegate.zoo.errors import ZooError, check_name, inside

SUITES_DIR = Path(__file__).resolve().parent / "suites"
SUITES: tuple[str, ...] = ("arith", "recall", "json", "similarity")
SPLITS: tuple[str, ...] = ("test", "calibration")
CHAT_SUITES: tuple[str, ...] = ("extraction", "tools")
"""Suites for instruct models, with a `test` split only (their items and generator: zoo/chat_suites.py)."""
WRITTEN_SUITES: tuple[str, ...] = ("facts", "format")
"""Hand-written `kind: chat` suites for instruct models, `test` split only: `facts`, short factual questions with a
one-word or number answer (`contains_answer`); `format`, instructions whose rule each answer must obey, the rule
as the item's reference (`format_followed`; rules in zoo/answer_checks.py)."""

REQUIRED_FIELDS: tuple[str, ...] = ("id", "prompt", "reference")
JSON_SCHEMA_PATH = SUITES_DIR / "json.schema.json"
# datasets builder for each accepted file extension.
BUILDERS: dict[str, str] = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def suite_path(name: str, split: str = "test") -> Path:
    """The JSONL file of split ``split`` (``test`` or ``calibration``) of zoo suite ``name``."""
    check_name("suite", name, SUITES + CHAT_SUITES + WRITTEN_SUITES)
    check_name("split", split, SPLITS if name in SUITES else ("test",))
    return inside(SUITES_DIR, SUITES_DIR / f"{name}.{split}.jsonl")


def json_output_schema() -> dict[str, Any]:
    """The JSON Schema every ``json`` suite completion must satisfy."""
    schema: dict[str, Any] = json.loads(JSON_SCHEMA_PATH.read_text(encoding="utf-8"))
    return schema


def resolve_suite(name_or_path: str, split: str = "test") -> Path:
    """A zoo suite name (``arith`` or ``zoo:arith``) or a local file, as a path to read."""
    name = name_or_path.removeprefix("zoo:")
    if name_or_path.startswith("zoo:") or name in SUITES + CHAT_SUITES + WRITTEN_SUITES:
        return suite_path(name, split)
    path = Path(name_or_path).expanduser()
    if path.suffix.lower() not in BUILDERS:
        raise ZooError(
            f"suite {name_or_path!r} is neither a zoo suite ({', '.join(SUITES + CHAT_SUITES + WRITTEN_SUITES)}) "
            f"nor a {'/'.join(BUILDERS)} file"
        )
    if not path.is_file():
        raise ZooError(f"suite file {path} does not exist")
    return path


def load_suite(name_or_path: str, split: str = "test", limit: int | None = None) -> list[dict[str, Any]]:
    """Load a suite's items (the first ``limit`` when given) through ``datasets.load_dataset``."""
    from servegate.zoo.package_suites import PACKAGE_SUITES, package_suite

    if name_or_path.removeprefix("zoo:") in PACKAGE_SUITES:
        return package_suite(name_or_path.removeprefix("zoo:"), split, limit)
    import datasets  # imported here: it is slow to import and only loading needs it

    path = resolve_suite(name_or_path, split)
    if limit is not None and limit < 0:
        raise ZooError(f"limit must be >= 0 (got {limit})")
    dataset = datasets.load_dataset(BUILDERS[path.suffix.lower()], data_files=str(path), split="train")
    missing = [field for field in REQUIRED_FIELDS if field not in dataset.column_names]
    if missing:
        raise ZooError(
            f"suite {path} lacks the field(s) {', '.join(missing)}: every item needs "
            f"{', '.join(REQUIRED_FIELDS)} (it has {', '.join(dataset.column_names)})"
        )
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    return [dict(row) for row in dataset]
