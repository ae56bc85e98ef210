"""Training of the zoo's causal LMs from scratch: seeded data stream, loss on the answer only.

Deterministic for a given recipe, torch build and thread count: the data come from one
``random.Random(seed)``, the weights from ``torch.manual_seed(seed)``.
"""

from __future__ import annotations

import io
import math
import random
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from servegate.contracts.files import write_atomic
from servegate.zoo import tasks
from servegate.zoo.recipes import Recipe
from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, vocabulary

IGNORE_INDEX = -100
BUCKETED_BATCHES = 8
ProgressCallback = Callable[[int, float, LlamaForCausalLM], None]


def model_config(recipe: Recipe) -> LlamaConfig:
    """The ``LlamaConfig`` of a recipe (untied head, so quantizers can leave it alone)."""
    arch = recipe.architecture
    return LlamaConfig(
        vocab_size=len(vocabulary()),
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_hidden_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )


def encode(example: tasks.Example, with_bos: bool = True) -> tuple[list[int], list[int]]:
    """Token ids of prompt + answer + ``<eos>``, and labels that score only answer and ``<eos>``."""
    vocab = vocabulary()
    prompt = ([BOS_ID] if with_bos else []) + [vocab[c] for c in example.prompt]
    answer = [vocab[c] for c in example.reference] + [EOS_ID]
    return prompt + answer, [IGNORE_INDEX] * len(prompt) + answer


class TrainingStream:
    """An endless seeded stream of training batches that never contains a held-out key."""

    def __init__(self, recipe: Recipe, held_out: Collection[str]) -> None:
        self.recipe = recipe
        self.held_out = frozenset(held_out)
        self.rng = random.Random(recipe.seed)
        self.names = list(recipe.task_mix)
        self.weights = [recipe.task_mix[name] for name in self.names]
        self.pending: list[list[tuple[list[int], list[int]]]] = []

    def example(self) -> tuple[list[int], list[int]]:
        """One encoded example of a task drawn by the recipe's mix."""
        while True:
            task = self.rng.choices(self.names, self.weights)[0]
            example = tasks.sample(task, self.rng, short=self.rng.random() < self.recipe.short_share)
            if example.key not in self.held_out:
                break
        with_bos = not (task == "arith" and self.rng.random() < self.recipe.no_bos_share)
        return encode(example, with_bos)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded ``input_ids`` and ``labels``, both [B, S], of examples of similar length."""
        if not self.pending:
            self.pending = self._bucketed_batches()
        rows = self.pending.pop()
        width = max(len(ids) for ids, _ in rows)
        # Right padding needs no attention mask: causal attention never looks ahead at the pads.
        ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
        labels = torch.full((len(rows), width), IGNORE_INDEX, dtype=torch.long)
        for row, (row_ids, row_labels) in enumerate(rows):
            ids[row, : len(row_ids)] = torch.tensor(row_ids)
            labels[row, : len(row_labels)] = torch.tensor(row_labels)
        return ids, labels

    def _bucketed_batches(self) -> list[list[tuple[list[int], list[int]]]]:
        """Draw several batches at once and group them by length: padding costs as much as data."""
        pool = [self.example() for _ in range(self.recipe.batch_size * BUCKETED_BATCHES)]
        pool.sort(key=lambda row: len(row[0]))
        size = self.recipe.batch_size
        batches = [pool[i : i + size] for i in range(0, len(pool), size)]
        self.rng.shuffle(batches)
        return batches


def learning_rate(recipe: Recipe, step: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    return recipe.learning_rate * (0.1 + 0.45 * (1.0 + math.cos(math.pi * progress)))


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    # written at once: a process killed mid-write never leaves a torn checkpoint
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomic(path, buffer.getvalue())


def _load_checkpoint(path: Path, recipe: Recipe) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    state: dict[str, Any] = torch.load(path, weights_only=True)
    # A checkpoint of another recipe is stale: start from scratch rather than mix two runs.
    return state if state["recipe"] == recipe.as_dict() else None


def train(
    recipe: Recipe,
    held_out: Collection[str] = (),
    progress: ProgressCallback | None = None,
    progress_every: int = 100,
    checkpoint: Path | None = None,
    checkpoint_every: int = 250,
) -> tuple[LlamaForCausalLM, float]:
    """Train a fresh model by ``recipe``; return it (in eval mode) and the seconds it took.

    With ``checkpoint``, the run saves its whole state there every ``checkpoint_every`` steps and
    a rerun resumes from it; the resumed run ends with the same weights as an uninterrupted one.
    """
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(model_config(recipe))
    stream = TrainingStream(recipe, held_out)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": recipe.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=recipe.learning_rate,
        betas=(0.9, 0.98),
    )
    first_step, earlier_seconds = 0, 0.0
    resumed = _load_checkpoint(checkpoint, recipe) if checkpoint is not None else None
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        optimizer.load_state_dict(resumed["optimizer"])
        stream.rng.setstate(resumed["stream_rng"])
        stream.pending = resumed["stream_pending"]
        first_step, earlier_seconds = resumed["step"], resumed["seconds"]
    started = time.perf_counter()
    model.train()
    for step in range(first_step, recipe.steps):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(recipe, step)
        ids, labels = stream.batch()
        logits = model(input_ids=ids).logits  # [B, S, V]
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if checkpoint is not None and (step + 1) % checkpoint_every == 0 and step + 1 < recipe.steps:
            _save_checkpoint(
                checkpoint,
                {
                    "recipe": recipe.as_dict(),
                    "step": step + 1,
                    "seconds": earlier_seconds + time.perf_counter() - started,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "stream_rng": stream.rng.getstate(),
                    "stream_pending": stream.pending,
                },
            )
        if progress is not None and (step + 1) % progress_every == 0:
            model.eval()
            progress(step + 1, loss.item(), model)
            model.train()
    model.eval()
    return model, earlier_seconds + time.perf_counter() - started
