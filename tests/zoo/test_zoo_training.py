"""Training is seeded and resumable: same recipe, same weights, interrupted or not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from servegate.zoo.recipes import RECIPES
from servegate.zoo.tokenizer import vocabulary
from servegate.zoo.training import TrainingStream, train

TINY = dataclasses.replace(RECIPES["tiny-fallback"], steps=6, warmup_steps=2, batch_size=4)


class Interrupted(Exception):
    """Stands in for a process killed in the middle of training."""


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))


def test_same_recipe_same_weights() -> None:
    assert _same(train(TINY)[0], train(TINY)[0])


def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run.checkpoint.pt"

    def stop_at_four(step: int, loss: float, model: torch.nn.Module) -> None:
        if step == 4:
            raise Interrupted

    with pytest.raises(Interrupted):
        train(TINY, progress=stop_at_four, progress_every=1, checkpoint=checkpoint, checkpoint_every=3)
    assert checkpoint.is_file()
    resumed, _ = train(TINY, checkpoint=checkpoint, checkpoint_every=3)
    assert _same(resumed, train(TINY)[0])


def test_a_checkpoint_of_another_recipe_is_ignored(tmp_path: Path) -> None:
    checkpoint = tmp_path / "run.checkpoint.pt"
    other = dataclasses.replace(TINY, seed=TINY.seed + 1)
    train(other, checkpoint=checkpoint, checkpoint_every=3)
    assert _same(train(TINY, checkpoint=checkpoint, checkpoint_every=3)[0], train(TINY)[0])


def test_held_out_keys_never_reach_training() -> None:
    json_only = dataclasses.replace(TINY, task_mix={"json": 1.0})
    characters = {index: token for token, index in vocabulary().items()}

    def keys(stream: TrainingStream, n: int) -> list[str]:
        found = []
        for _ in range(n):
            ids, _labels = stream.example()
            prompt = json.loads("".join(characters[i] for i in ids[1:]).split("}")[0] + "}")
            found.append(f"{prompt['a']}+{prompt['b']}")
        return found

    first = keys(TrainingStream(json_only, held_out=()), 20)
    # Same seed, so without the hold-out the stream would start with exactly these keys.
    assert not set(first) & set(keys(TrainingStream(json_only, held_out=set(first)), 200))
