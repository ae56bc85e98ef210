"""``gate zoo build``: retrain a zoo model from its recipe, save it, measure it, write its datasheet.

The committed models are what this produced; run on the same torch build and thread count it
reproduces them bit for bit, elsewhere within the slow test's 2 points.
"""

from __future__ import annotations

import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedModel

from servegate.zoo import tasks
from servegate.zoo.catalog import MODELS_DIR, TRAINED_MODELS, record_model
from servegate.zoo.datasheet import render_datasheet
from servegate.zoo.errors import check_name
from servegate.zoo.eval_suites import load_suite
from servegate.zoo.measurement import measure
from servegate.zoo.recipes import RECIPES
from servegate.zoo.scoring import exact_match_rate, greedy_completions
from servegate.zoo.suite_generator import held_out_keys
from servegate.zoo.tokenizer import BOS_ID, EOS_ID, PAD_ID, build_char_tokenizer
from servegate.zoo.training import ProgressCallback, train

Log = Callable[[str], None]


@dataclass(frozen=True)
class BuildResult:
    """Where a build went, how long training took, and what it measured."""

    path: Path
    training_seconds: float
    total_seconds: float
    metrics: dict[str, Any]


def generation_config() -> GenerationConfig:
    """Greedy decoding that stops at ``<eos>``: the output contract of every zoo causal LM."""
    return GenerationConfig(
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        do_sample=False,
        max_new_tokens=tasks.MAX_NEW_TOKENS,
    )


def save_model(model: PreTrainedModel, out_dir: Path) -> None:
    """Write weights (safetensors), config, generation config and tokenizer to ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = generation_config()
    model.save_pretrained(out_dir)
    build_char_tokenizer().save_pretrained(out_dir)


def _monitor(recipe_steps: int, started: float, log: Log, every: int) -> ProgressCallback:
    """Log the loss, and every ``every`` steps exact match on 64 calibration items per task."""
    tokenizer = build_char_tokenizer()
    probes = {suite: load_suite(suite, "calibration", limit=64) for suite in tasks.TASKS}

    def progress(step: int, loss: float, model: PreTrainedModel) -> None:
        line = f"step {step}/{recipe_steps}  loss {loss:.4f}  {time.perf_counter() - started:.0f}s"
        if every and step % every == 0:
            scores = {
                suite: exact_match_rate(
                    greedy_completions(model, tokenizer, [i["prompt"] for i in items]),
                    [i["reference"] for i in items],
                )
                for suite, items in probes.items()
            }
            line += "  calibration exact match " + ", ".join(f"{s} {100 * v:.0f}%" for s, v in scores.items())
        log(line)

    return progress


def build_model(name: str, out_dir: Path | None = None, log: Log = print, monitor_every: int = 500) -> BuildResult:
    """Train zoo model ``name`` from scratch into ``out_dir`` (default: the zoo itself, recorded in the index)."""
    check_name("trainable model", name, TRAINED_MODELS)
    recipe = RECIPES[name]
    target = out_dir if out_dir is not None else MODELS_DIR / name
    started = time.perf_counter()
    progress = _monitor(recipe.steps, started, log, monitor_every)
    # Beside the target, not in it: an interrupted build resumes, a finished one ships no checkpoint.
    checkpoint = target.parent / f".{target.name}.checkpoint.pt"
    target.parent.mkdir(parents=True, exist_ok=True)
    model, training_seconds = train(recipe, held_out_keys(), progress=progress, checkpoint=checkpoint)
    # Training time depends on what else runs on the cores; the load average puts it in context.
    load_after_training = os.getloadavg()[0]
    metrics = publish_model(name, model, training_seconds, load_after_training, target, log, record=out_dir is None)
    checkpoint.unlink(missing_ok=True)
    return BuildResult(target, training_seconds, time.perf_counter() - started, metrics)


def publish_model(
    name: str,
    model: PreTrainedModel,
    training_seconds: float,
    load_after_training: float,
    target: Path,
    log: Log = print,
    record: bool = True,
) -> dict[str, Any]:
    """Write a model trained by ``name``'s recipe to ``target``: weights, tokenizer, measured metrics.json and
    DATASHEET.md, and (``record``) its catalogue entry with the files' checksums. Returns the metrics."""
    recipe = RECIPES[name]
    save_model(model, target)
    log(f"trained {name} in {training_seconds:.1f}s; measuring on the test suites")
    measured = measure(model, build_char_tokenizer())
    metrics: dict[str, Any] = {
        "model": name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "recipe": recipe.as_dict(),
        "training_seconds": round(training_seconds, 1),
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "threads": recipe.threads,
            "cpu_count": os.cpu_count(),
            "load_average_1min_after_training": round(load_after_training, 1),
        },
        "limits": {
            "safe_max_input_tokens": tasks.SAFE_MAX_INPUT_TOKENS,
            "tight_max_input_tokens": tasks.TIGHT_MAX_INPUT_TOKENS,
            "max_new_tokens": tasks.MAX_NEW_TOKENS,
        },
        "prompt_tokens": {
            "arith": list(tasks.ARITH_PROMPT_TOKENS),
            "recall": list(tasks.RECALL_PROMPT_TOKENS),
            "json": [tasks.JSON_PROMPT_TOKENS, tasks.JSON_PROMPT_TOKENS],
        },
        **measured,
    }
    (target / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n", encoding="utf-8")
    (target / "DATASHEET.md").write_text(render_datasheet(metrics), encoding="utf-8")
    if record:
        record_model(
            name,
            kind="causal-lm",
            parameters=metrics["parameters"],
            suites=["arith", "recall", "json"],
            description=DESCRIPTIONS[name],
            path=target,
        )
    return metrics


DESCRIPTIONS: dict[str, str] = {
    "tiny-primary": "1.1M-parameter character-level Llama trained by servegate on arith, recall and json; "
    "the default model",
    "tiny-fallback": "136k-parameter Llama with the primary's tokenizer, trained 1500 steps: arith and json, "
    "no recall; the default fallback",
}
