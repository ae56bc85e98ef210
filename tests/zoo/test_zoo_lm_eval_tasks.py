"""The zoo's lm-eval tasks: the seeded multiple-choice suite and the task YAMLs with local data files."""

from __future__ import annotations

import json
from pathlib import Path

from ruamel.yaml import YAML

from servegate.zoo.choice_suite import CHOICE_PATH, generate
from servegate.zoo.eval_suites import SUITES_DIR
from servegate.zoo.lm_eval_tasks import TASKS, task_dir


def test_the_choice_suite_is_reproduced_by_its_seeded_generator() -> None:
    committed = [json.loads(line) for line in CHOICE_PATH.read_text(encoding="ascii").splitlines()]
    assert committed == generate()
    arith = [json.loads(line) for line in (SUITES_DIR / "arith.test.jsonl").read_text().splitlines()]
    for item, source in zip(committed, arith, strict=False):
        assert item["prompt"] == source["prompt"] and item["reference"] == source["reference"]
        assert len(set(item["choices"])) == 4 and item["choices"][item["label"]] == item["reference"]
        wrong = [int(c) - int(item["reference"]) for c in item["choices"] if c != item["reference"]]
        assert all(abs(d) in (1, 10, 100) for d in wrong)  # one digit's place away
    assert len({item["label"] for item in committed}) == 4  # the right answer is not always in one place


def test_task_dir_writes_the_yamls_with_absolute_data_files(tmp_path: Path) -> None:
    folder = task_dir(tmp_path)
    assert task_dir(tmp_path) == folder  # written once per content
    yaml = YAML(typ="safe")
    for name in TASKS:
        config = yaml.load((folder / f"{name}.yaml").read_text(encoding="utf-8"))
        assert config["task"] == name and config["dataset_path"] == "json"
        for file in config["dataset_kwargs"]["data_files"].values():
            assert Path(file).is_absolute() and Path(file).is_file() and Path(file).parent == SUITES_DIR
