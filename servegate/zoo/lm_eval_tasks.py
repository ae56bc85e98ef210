"""lm-evaluation-harness task YAMLs over the zoo's suites, readable offline (`dataset_path: json`).

The shipped YAMLs (zoo/task_yamls/) name their data files relative to the zoo's suites folder; lm-eval
hands `data_files` to `datasets` as they are, relative to the working directory. `task_dir()` writes a
copy whose data files are absolute paths into servegate's cache and returns it: the folder to give
`lm_eval --include_path` (or `lm_eval.include_path: zoo` in a manifest).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from ruamel.yaml import YAML

from servegate.zoo.eval_suites import SUITES_DIR

YAML_DIR = Path(__file__).resolve().parent / "task_yamls"
TASKS: tuple[str, ...] = ("zoo_arith", "zoo_arith_choice")
"""Tasks the zoo ships: `zoo_arith` (generate_until, exact_match), `zoo_arith_choice` (multiple_choice, acc)."""


def task_dir(root: Path | None = None) -> Path:
    """A folder of the zoo's task YAMLs with absolute data files (written once per content, atomically)."""
    yaml = YAML()
    texts = {path.name: path.read_text(encoding="utf-8") for path in sorted(YAML_DIR.glob("*.yaml"))}
    digest = hashlib.sha256(repr((sorted(texts.items()), str(SUITES_DIR))).encode()).hexdigest()[:16]
    base = root or Path(os.environ.get("SERVEGATE_CACHE") or tempfile.gettempdir()) / "servegate-lm-eval-tasks"
    out = base / digest
    if out.is_dir():
        return out
    staging = Path(tempfile.mkdtemp(prefix=f"{digest}-", dir=_made(base)))
    for name, text in texts.items():
        config = yaml.load(text)
        files = config["dataset_kwargs"]["data_files"]
        for split, file in files.items():
            files[split] = str(SUITES_DIR / file)
        with (staging / name).open("w", encoding="utf-8") as handle:
            yaml.dump(config, handle)
    try:
        staging.rename(out)
    except OSError:  # another process wrote the same folder first: theirs is identical
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path
