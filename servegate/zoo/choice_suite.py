"""The zoo's multiple-choice suite: pick the correct sum among four, scored by log-likelihood.

Built from the first items of the `arith` test split (prompts the zoo models never trained on): each
item keeps the prompt and adds three wrong sums near the right one (off by one digit's place, so a model
has to get every digit right), in a seeded order. Regenerate with ``python -m servegate.zoo.choice_suite``.

Item fields: ``id``, ``prompt``, ``choices`` (four 4-digit sums), ``label`` (index of the right one) and
``reference`` (the right sum, as in ``arith``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from servegate.zoo.eval_suites import SUITES_DIR, suite_path

CHOICE_SUITE = "arith_choice"
CHOICE_PATH = SUITES_DIR / f"{CHOICE_SUITE}.test.jsonl"
SIZE = 200
SEED = 7001
_OFFSETS = (-100, -10, -1, 1, 10, 100)


def _distractors(total: int, rng: random.Random) -> list[int]:
    """Three distinct wrong sums in 0..1998, each one digit's place away from `total`."""
    near = [total + d for d in _OFFSETS if 0 <= total + d <= 1998]
    return rng.sample(near, 3)


def generate(size: int = SIZE, seed: int = SEED) -> list[dict[str, Any]]:
    """The suite's items, the same for the same size and seed."""
    rng = random.Random(seed)
    rows = [json.loads(line) for line in suite_path("arith", "test").read_text(encoding="ascii").splitlines()]
    items = []
    for row in rows[:size]:
        total = int(row["reference"])
        choices = [total, *_distractors(total, rng)]
        rng.shuffle(choices)
        items.append(
            {
                "id": row["id"].replace("arith-", f"{CHOICE_SUITE}-"),
                "prompt": row["prompt"],
                "choices": [f"{c:04d}" for c in choices],
                "label": choices.index(total),
                "reference": row["reference"],
            }
        )
    return items


def write(path: Path = CHOICE_PATH) -> Path:
    """Write the suite as JSONL (one object a line, ASCII only)."""
    path.write_text("".join(json.dumps(item, ensure_ascii=True) + "\n" for item in generate()), encoding="ascii")
    return path


if __name__ == "__main__":
    print(write())
