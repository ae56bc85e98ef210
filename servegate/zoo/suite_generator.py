"""Seeded generators of the zoo's eval suites; they reproduce the committed JSONL byte for byte.

Regenerate with ``python -m servegate.zoo.suite_generator``. Every suite has a ``test`` split
(what gates score) and a disjoint ``calibration`` split (what quantizers may look at).

Item fields:

* ``arith``, ``recall``, ``json``: ``id``, ``task``, ``prompt``, ``reference`` (the exact
  completion, ``<eos>`` not included) and ``prompt_tokens`` (zoo tokens, ``<bos>`` included).
* ``similarity``: ``id``, ``prompt`` (anchor sentence), ``reference`` (a paraphrase of it),
  ``negative`` (an unrelated sentence), ``topic`` and ``negative_topic``. Each item is two
  labelled pairs: (prompt, reference) similar, (prompt, negative) not similar.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servegate.zoo import tasks
from servegate.zoo.eval_suites import SPLITS, SUITES, SUITES_DIR
from servegate.zoo.similarity_templates import triplet

SIZES: dict[str, int] = {"test": 500, "calibration": 200}
SIMILARITY_SIZES: dict[str, int] = {"test": 250, "calibration": 100}
# One seed per (suite, split), so changing one file never changes another.
SEEDS: dict[tuple[str, str], int] = {
    (suite, split): 1000 * (i + 1) + j for i, suite in enumerate(SUITES) for j, split in enumerate(SPLITS)
}


def _task_items(suite: str, split: str, taken: set[str]) -> Iterator[dict[str, Any]]:
    rng = random.Random(SEEDS[suite, split])
    low, high = tasks.ARITH_PROMPT_TOKENS if suite == "arith" else tasks.RECALL_PROMPT_TOKENS
    count = 0
    while count < SIZES[split]:
        if suite == "arith":
            # Lengths cycle through the whole range so every length is represented.
            length = low + count % (high - low + 1)
            example = tasks.arith(rng.randrange(1000), rng.randrange(1000), length, rng)
        elif suite == "recall":
            length = low + count % (high - low + 1)
            example = tasks.recall(tasks.random_code(rng), length, rng)
        else:
            example = tasks.json_sum(rng.randrange(1000), rng.randrange(1000))
        if example.key in taken:
            continue
        taken.add(example.key)
        yield {
            "id": f"{suite}-{split}-{count:04d}",
            "task": example.task,
            "prompt": example.prompt,
            "reference": example.reference,
            "prompt_tokens": example.prompt_tokens,
        }
        count += 1


def _similarity_items(split: str, taken: set[str]) -> Iterator[dict[str, Any]]:
    rng = random.Random(SEEDS["similarity", split])
    count = 0
    while count < SIMILARITY_SIZES[split]:
        t = triplet(rng)
        if t.anchor in taken:
            continue
        taken.add(t.anchor)
        yield {
            "id": f"similarity-{split}-{count:04d}",
            "prompt": t.anchor,
            "reference": t.paraphrase,
            "negative": t.unrelated,
            "topic": t.topic,
            "negative_topic": t.unrelated_topic,
        }
        count += 1


def generate(suite: str) -> dict[str, list[dict[str, Any]]]:
    """All splits of one suite; keys (operands, codes, anchors) never repeat across splits."""
    taken: set[str] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for split in SPLITS:
        items = _similarity_items(split, taken) if suite == "similarity" else _task_items(suite, split, taken)
        out[split] = list(items)
    return out


def render(items: list[dict[str, Any]]) -> str:
    """JSONL text: one object a line, ASCII only, keys in generation order."""
    return "".join(json.dumps(item, ensure_ascii=True) + "\n" for item in items)


def held_out_keys() -> set[str]:
    """Every operand pair and code that appears in any causal suite: training must avoid them."""
    keys: set[str] = set()
    for suite in ("arith", "recall", "json"):
        for items in generate(suite).values():
            for item in items:
                keys.add(_key(item))
    return keys


def _key(item: dict[str, Any]) -> str:
    if item["task"] == "recall":
        return str(item["reference"])
    if item["task"] == "json":
        sums = json.loads(item["prompt"])
        return f"{sums['a']}+{sums['b']}"
    # The operands are the last 8 characters, "773+097=", of every arith prompt.
    return str(item["prompt"])[-8:-1]


def write_all(directory: Path = SUITES_DIR) -> list[Path]:
    """Write every suite's splits as ``<suite>.<split>.jsonl`` under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for suite in SUITES:
        for split, items in generate(suite).items():
            path = directory / f"{suite}.{split}.jsonl"
            path.write_text(render(items), encoding="ascii")
            written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_all():
        print(written_path)
