"""The recipes of the zoo's trained causal LMs: architecture, data mix, optimiser, steps and seed.

A recipe is everything ``gate zoo build NAME`` needs to reproduce a committed model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Architecture:
    """The ``LlamaConfig`` fields that differ between zoo models."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int


@dataclass(frozen=True)
class Recipe:
    """How one zoo model is trained, from seed to last step."""

    name: str
    architecture: Architecture
    steps: int
    batch_size: int
    learning_rate: float
    warmup_steps: int
    weight_decay: float
    seed: int
    # Share of training examples drawn from each task.
    task_mix: dict[str, float] = field(default_factory=lambda: {"arith": 0.35, "recall": 0.35, "json": 0.3})
    # Share of arith examples trained without <bos>, as left truncation may have removed it.
    no_bos_share: float = 0.25
    # Share of arith and recall examples drawn from the shortest lengths (cheap; the rest cover all).
    short_share: float = 0.5
    # One thread: the same float operations in the same order on any machine, and no lost time
    # when other processes share the cores.
    threads: int = 1
    boundary: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The recipe as plain data, for the datasheet and metrics.json."""
        return asdict(self)


# Both models share one architecture and seed: the fallback is the same recipe stopped after 1500
# steps, so it keeps the tokenizer and output contract (EOS-terminated answers, valid JSON) but
# knows less. Larger primaries (hidden 128-192, 2-4 layers) at lr 3e-3 and batch 32 did not converge
# within 3000-4000 steps. Measured on an idle machine (2026-11-30, 1 thread): hidden 128,
# intermediate 512, 4 layers, 4 heads, 2 KV heads (1,009,792 parameters), lr 2e-3, batch 64, 3000
# steps, seed 4321 trained in 1614 s to fp32 test exact match arith 99.2%, recall 97.0%, json 94.2%
# (int8 the same, int2 85.8/81.8/60.0): json just under the 95% bar, so it is not the primary yet.
RECIPES: dict[str, Recipe] = {
    "tiny-primary": Recipe(
        name="tiny-primary",
        architecture=Architecture(64, 256, 2, 4, 2),
        steps=4000,
        batch_size=32,
        learning_rate=3e-3,
        warmup_steps=100,
        weight_decay=0.01,
        seed=4321,
    ),
    "tiny-fallback": Recipe(
        name="tiny-fallback",
        architecture=Architecture(64, 256, 2, 4, 2),
        steps=1500,
        batch_size=32,
        learning_rate=3e-3,
        warmup_steps=100,
        weight_decay=0.01,
        seed=4321,
        # What the fallback promises (fp32 exact match on each test split); measured values are higher.
        # Recall needs longer training: the fallback does not promise it.
        boundary={"arith": 0.75, "json": 0.75},
    ),
}
