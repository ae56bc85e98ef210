"""Build real quantized checkpoints of zoo:smollm2-135m-instruct with llm-compressor.

Runs in llm-compressor's own venv (`make llmcompressor-venv`; it pins a transformers older than
servegate's), so it imports nothing from servegate. `make checkpoints` runs it as

    .venvs/llmcompressor/bin/python scripts/build_checkpoints.py --model "$(gate zoo path smollm2-135m-instruct)"

Each build is a compressed-tensors folder, `OUT/NAME/`, as teams ship them: the model saved with
`save_pretrained(..., save_compressed=True)`, llm-compressor's `recipe.yaml`, the source folder's tokenizer
and chat template (so the folder loads on its own), and `servegate-build.json` (toolchain versions, scheme,
recipe, calibration set and source hashes, build seconds). A folder that already has `servegate-build.json`
is skipped unless --force; a build is written to `OUT/.NAME.partial` and renamed when complete.

The calibration file is JSON lines, one object per line: `{"text": ...}` is plain text (English, code,
JSON) tokenized as it is; `{"text": ..., "reply": ...}` is a chat turn, rendered with the tokenizer's chat
template as a user message and the assistant's reply, so calibration sees the layout the model serves.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

DEFAULT_OUT = Path("examples/smollm2/checkpoints")
DEFAULT_CALIBRATION = Path("examples/smollm2/calibration.jsonl")
BUILD_RECORD = "servegate-build.json"
# Tokenizer files copied verbatim from the source folder, so each checkpoint is self-contained.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# The calibration rows are one or two sentences; 256 tokens never truncates them but bounds a bad row.
MAX_SEQ_LEN = 256
# SmolLM2's hidden size is 576: the presets' group of 128 does not divide it, 64 does (576 = 9 * 64).
GROUP_SIZE = 64


@dataclass(frozen=True)
class Build:
    """One checkpoint: its folder name, what it is, and how to make its llm-compressor recipe."""

    name: str  # the folder under --out
    scheme: str  # the scheme in words, as servegate-build.json records it
    group_size: int | None  # weights per scale; None for per-channel
    calibrated: bool  # whether the recipe runs on the calibration set (GPTQ) or data-free (round-to-nearest)
    recipe: Callable[[], Any]  # makes the llm-compressor modifier; imported late, this file loads without it
    why: str  # what the checkpoint stands for in the gates


def _group_weights(num_bits: int) -> dict[str, Any]:
    """Symmetric static integer weights, one scale per GROUP_SIZE inputs, as compressed-tensors spells them."""
    # Symmetric, as the presets: vLLM's CPU and GPU int4 kernels take symmetric weights without zero points.
    return {"num_bits": num_bits, "type": "int", "symmetric": True, "strategy": "group", "group_size": GROUP_SIZE}


def _w8a8_recipe() -> Any:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    # Round-to-nearest on llm-compressor's W8A8 preset (int8 per-channel weights, dynamic per-token int8
    # activations), not GPTQ: on the 2-core CI VM GPTQ W8A8 took 144 s (SmoothQuant + GPTQ 258 s) against
    # 14 s here, and bought nothing at 8 bits (held-out perplexity 14.6 with GPTQ, 14.1 without, 14.4 for
    # the float32 source). Dynamic activation scales are computed per token at run time: no calibration.
    return QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])


def _w4a16_recipe() -> Any:
    from llmcompressor.modifiers.quantization import GPTQModifier

    # The W4A16 preset's group of 128 is refused for hidden 576, so the group is spelled out. GPTQ, not
    # round-to-nearest, because 4 bits lose quality: held-out perplexity 22.2 against 24.8 (source 14.4).
    return GPTQModifier(
        ignore=["lm_head"],
        config_groups={"group_0": {"targets": ["Linear"], "weights": _group_weights(4)}},
    )


def _w2a16_bad_recipe() -> Any:
    from llmcompressor.modifiers.quantization import QuantizationModifier

    # Deliberately broken: 2-bit round-to-nearest leaves four levels per group of 64, which wrecks a 135M
    # model (held-out perplexity in the millions, answers are word salad). It stands for a bad checkpoint
    # a quantization gate must refuse; compressed-tensors packs 2-bit weights like 4-bit ones.
    return QuantizationModifier(
        ignore=["lm_head"],
        config_groups={"group_0": {"targets": ["Linear"], "weights": _group_weights(2)}},
    )


BUILDS: dict[str, Build] = {
    build.name: build
    for build in (
        Build(
            name="w8a8",
            scheme="W8A8 (int8 per-channel weights, dynamic per-token int8 activations), round-to-nearest",
            group_size=None,
            calibrated=False,
            recipe=_w8a8_recipe,
            why="good: the usual int8 serving checkpoint",
        ),
        Build(
            name="w4a16",
            scheme=f"W4A16 (int4 symmetric weights, group {GROUP_SIZE}), GPTQ",
            group_size=GROUP_SIZE,
            calibrated=True,
            recipe=_w4a16_recipe,
            why="good: the usual 4-bit weight-only checkpoint",
        ),
        Build(
            name="w2a16-bad",
            scheme=f"W2A16 (int2 symmetric weights, group {GROUP_SIZE}), round-to-nearest",
            group_size=GROUP_SIZE,
            calibrated=False,
            recipe=_w2a16_bad_recipe,
            why="bad on purpose: quality visibly damaged",
        ),
    )
}


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def calibration_texts(path: Path, tokenizer: Any) -> list[str]:
    """The calibration rows as the model sees them: chat rows through the chat template, plain rows as they are."""
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise SystemExit(f'{path}:{number}: each line must be a JSON object with a string "text"')
        if "reply" in row:
            messages = [{"role": "user", "content": row["text"]}, {"role": "assistant", "content": row["reply"]}]
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False))
        else:
            texts.append(row["text"])
    return texts


def calibration_dataset(texts: list[str], tokenizer: Any) -> Any:
    """A tokenized `datasets.Dataset` (input_ids, attention_mask), so llm-compressor uses it as given."""
    from datasets import Dataset

    # The chat template already holds the special tokens; plain text gets none, as the server sends it.
    encoded = tokenizer(texts, add_special_tokens=False, truncation=True, max_length=MAX_SEQ_LEN)
    return Dataset.from_dict({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]})


def folder_mib(folder: Path) -> float:
    """Total size of a folder's files in MiB."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / (1 << 20)


def build_one(build: Build, model_dir: Path, out: Path, calibration: Path, source_sha256: str) -> float:
    """Quantize the source model with one recipe, save it compressed with its record, and return the seconds."""
    import torch
    from llmcompressor import oneshot
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.monotonic()
    torch.manual_seed(0)
    partial = out / f".{build.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    # The source's float32 is kept: the checkpoint then differs from the zoo model by quantization only.
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    recipe = build.recipe()
    calibration_record = None
    if build.calibrated:
        texts = calibration_texts(calibration, tokenizer)
        dataset = calibration_dataset(texts, tokenizer)
        oneshot(
            model=model,
            recipe=recipe,
            dataset=dataset,
            num_calibration_samples=len(texts),
            max_seq_length=MAX_SEQ_LEN,
            shuffle_calibration_samples=False,
        )
        calibration_record = {
            "file": calibration.name,
            "sha256": sha256_file(calibration),
            "samples": len(texts),
            "max_seq_len": MAX_SEQ_LEN,
        }
    else:
        # Round-to-nearest weights need no data: llm-compressor runs the recipe data-free.
        oneshot(model=model, recipe=recipe)
    model.save_pretrained(partial, save_compressed=True)
    for name in TOKENIZER_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, partial / name)
    recipe_file = partial / "recipe.yaml"
    seconds = time.monotonic() - started
    record = {
        "toolchain": "llm-compressor",
        "toolchain_version": version("llmcompressor"),
        "compressed_tensors_version": version("compressed-tensors"),
        "transformers_version": version("transformers"),
        "torch_version": version("torch"),
        "name": build.name,
        "scheme": build.scheme,
        "group_size": build.group_size,
        "purpose": build.why,
        "recipe": recipe_file.read_text(encoding="utf-8") if recipe_file.is_file() else repr(recipe),
        # null for a data-free build: its weights do not depend on any calibration set.
        "calibration": calibration_record,
        "source": {"folder": model_dir.name, "model_safetensors_sha256": source_sha256},
        "seconds": round(seconds, 1),
    }
    (partial / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out / build.name, ignore_errors=True)
    partial.rename(out / build.name)
    return seconds


def main(argv: list[str] | None = None) -> int:
    """Build the requested checkpoints (all by default), then print a table of size and build time."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the zoo model folder (gate zoo path NAME)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where builds go (default {DEFAULT_OUT})")
    parser.add_argument("--only", action="append", choices=sorted(BUILDS), help="build only NAME (repeatable)")
    parser.add_argument("--calibration", type=Path, default=DEFAULT_CALIBRATION, help="calibration JSON lines")
    parser.add_argument("--force", action="store_true", help="rebuild folders that are already built")
    args = parser.parse_args(argv)
    source = args.model / "model.safetensors"
    if not source.is_file():
        parser.error(f"{source} does not exist: run `gate zoo fetch smollm2-135m-instruct` (or `make fetch`)")
    if not args.calibration.is_file():
        parser.error(f"calibration file {args.calibration} does not exist")
    args.out.mkdir(parents=True, exist_ok=True)
    source_sha256 = ""  # hashed on the first build only: a run that keeps every folder reads nothing big
    rows = []
    for name in args.only or list(BUILDS):
        folder = args.out / name
        if (folder / BUILD_RECORD).is_file() and not args.force:
            seconds = json.loads((folder / BUILD_RECORD).read_text(encoding="utf-8"))["seconds"]
            print(f"[{name}] already built in {folder} (--force rebuilds it)", flush=True)
            rows.append((name, folder_mib(folder), seconds, "kept"))
            continue
        print(f"[{name}] building {BUILDS[name].scheme} ...", flush=True)
        source_sha256 = source_sha256 or sha256_file(source)
        seconds = build_one(BUILDS[name], args.model, args.out, args.calibration, source_sha256)
        print(f"[{name}] done in {seconds:.1f} s -> {folder}", flush=True)
        rows.append((name, folder_mib(folder), seconds, "built"))
    print(f"\n{'checkpoint':<12} {'MiB':>8} {'seconds':>8}")
    for name, mib, seconds, state in rows:
        print(f"{name:<12} {mib:>8.1f} {seconds:>8.1f}  {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
