"""Render a zoo model's DATASHEET.md from its measured ``metrics.json`` (nothing typed by hand)."""

from __future__ import annotations

from typing import Any

from servegate.zoo.quant_variants import VARIANTS
from servegate.zoo.tokenizer import vocabulary

SUITE_ORDER: tuple[str, ...] = ("arith", "recall", "json")
VARIANT_LABELS: dict[str, str] = {
    "none": "fp32 (reference)",
    "int8-weight": "int8 weight-only (torchao Int8WeightOnlyConfig)",
    "int4-weight": "int4 weight-only, groups of 32 (torchao IntxWeightOnlyConfig)",
    "fp8-weight": "fp8 e4m3 weight-only (torchao Float8WeightOnlyConfig)",
    "int2-weight": "int2 weight-only, groups of 32 (simulated round-trip)",
}


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _training_time(metrics: dict[str, Any]) -> str:
    env = metrics["environment"]
    text = f"{metrics['training_seconds'] / 60:.1f} min wall-clock (torch {env['torch']}, {env['machine']}"
    if "cpu_count" in env:
        text += f", {env['cpu_count']} cores"
    load = env.get("load_average_1min_after_training")
    if load is not None:
        text += f", 1-min load average {load} when training ended"
        if load > env["threads"] + 1:
            text += ": other jobs were sharing the cores, so expect it faster on an idle machine"
    return text + ")"


def _boundary_lines(metrics: dict[str, Any]) -> list[str]:
    boundary: dict[str, float] = metrics["recipe"].get("boundary") or {}
    if not boundary:
        return []
    measured = metrics["exact_match"]["none"]
    rows = [
        [suite, f">= {_pct(low)}", _pct(measured[suite]), "inside" if measured[suite] >= low else "OUTSIDE"]
        for suite, low in boundary.items()
    ]
    unpromised = [suite for suite in SUITE_ORDER if suite not in boundary]
    return [
        "## Fallback boundary",
        "",
        "As a fallback this model promises at least the exact match below on these test suites (fp32):",
        "",
        *_table(["suite", "boundary", "measured", "status"], rows),
        "",
        *([f"Not promised: {', '.join(unpromised)}.", ""] if unpromised else []),
    ]


def render_datasheet(metrics: dict[str, Any]) -> str:
    """The Markdown datasheet of one trained zoo model."""
    recipe = metrics["recipe"]
    lines = [
        f"# {metrics['model']}: datasheet",
        "",
        "A small causal language model trained from scratch by servegate's own code "
        f"(`servegate/zoo/training.py`, recipe `{recipe['name']}` in `servegate/zoo/recipes.py`) so that "
        "servegate can check a real served model on a machine with no model hub. It knows three tasks and "
        "nothing else. Every figure below was measured by `gate zoo build` and is stored in `metrics.json`.",
        "",
        *_architecture_section(metrics),
        *_tasks_section(metrics),
        *_quality_section(metrics),
        *_training_section(metrics),
    ]
    return "\n".join(lines)


def _architecture_section(metrics: dict[str, Any]) -> list[str]:
    """The architecture, tokenizer and output-contract sections."""
    arch = metrics["recipe"]["architecture"]
    limits = metrics["limits"]
    return [
        "## Architecture",
        "",
        *_table(
            ["field", "value"],
            [
                ["class", "LlamaForCausalLM (transformers.LlamaConfig)"],
                ["parameters", f"{metrics['parameters']:,}"],
                ["hidden size / intermediate", f"{arch['hidden_size']} / {arch['intermediate_size']}"],
                ["layers", str(arch["num_hidden_layers"])],
                ["attention heads / KV heads", f"{arch['num_attention_heads']} / {arch['num_key_value_heads']}"],
                ["vocabulary", f"{len(vocabulary())} (character level)"],
                ["max_position_embeddings", "256"],
                ["lm_head", "untied from the embeddings"],
                ["weights", "model.safetensors, float32"],
            ],
        ),
        "",
        "## Tokenizer",
        "",
        "One token per character of printable ASCII plus newline (anything else is `<unk>`), special tokens "
        "`<pad>`=0, `<bos>`=1, `<eos>`=2, `<unk>`=3. Encoding puts `<bos>` in front of every text; padding is "
        "on the left. Saved as `tokenizer.json`, so `AutoTokenizer.from_pretrained(dir)` loads it.",
        "",
        "## Output contract",
        "",
        f"Greedy decoding (`generation_config.json`: `do_sample=false`, `max_new_tokens={limits['max_new_tokens']}`). "
        "The completion is the answer followed by `<eos>`. `json` completions are validated by "
        "`servegate/zoo/suites/json.schema.json` (an object with exactly one key `sum`, four digits).",
        "",
    ]


def _tasks_section(metrics: dict[str, Any]) -> list[str]:
    """The suites and the truncation limits."""
    limits = metrics["limits"]
    lengths = metrics["prompt_tokens"]
    exact = metrics["exact_match"]
    return [
        "## Tasks and suites",
        "",
        *_table(
            ["suite", "prompt", "completion", "prompt tokens (with <bos>)"],
            [
                ["arith", "`<filler> 773+097=`", "`0870`", f"{lengths['arith'][0]}-{lengths['arith'][1]}"],
                ["recall", "`key=QZKX; <filler> key=`", "`QZKX`", f"{lengths['recall'][0]}-{lengths['recall'][1]}"],
                ["json", '`{"a":"773","b":"097"}`', '`{"sum":"0870"}`', f"{lengths['json'][0]}"],
            ],
        ),
        "",
        "The filler is lowercase words that carry nothing. In `arith` the operands are always the last 8 "
        "characters, so cutting the prompt from the left is harmless until it reaches them; in `recall` the "
        "answer stands at the very start, so any cut that removes the start loses it. Test splits have "
        f"{metrics['items']['arith']} items each; separate `calibration` splits exist for quantizers.",
        "",
        "## Truncation limits",
        "",
        f"* `max_input_tokens: {limits['safe_max_input_tokens']}` with left truncation is safe: only arith "
        f"filler is removed ({metrics['items_over_limit']['arith'][str(limits['safe_max_input_tokens'])]} of "
        f"{metrics['items']['arith']} arith items are longer; no recall or json item is).",
        f"* `max_input_tokens: {limits['tight_max_input_tokens']}` with left truncation is unsafe: every recall "
        "prompt loses its code, while arith and json are unaffected.",
        "",
        *_table(
            ["suite", "full prompt", *[f"{label}" for label in metrics["truncation_exact_match"]]],
            [
                [
                    suite,
                    _pct(exact["none"][suite]),
                    *[_pct(values[suite]) for values in metrics["truncation_exact_match"].values()],
                ]
                for suite in SUITE_ORDER
            ],
        ),
        "",
        "`left@N` keeps the last N tokens (`<bos>` counted, and dropped when cut), `right@N` the first N.",
        "",
    ]


def _quality_section(metrics: dict[str, Any]) -> list[str]:
    """Quality per quantization variant and the boundary lines."""
    exact = metrics["exact_match"]
    return [
        "## Quality per quantization variant",
        "",
        f"Exact match on the full test splits ({metrics['items']['arith']} items per suite), greedy, "
        "lm_head and embeddings unquantized. `agree` is the share of completions identical to fp32's.",
        "",
        *_table(
            ["variant", *SUITE_ORDER, "json schema-valid", *[f"agree {s}" for s in SUITE_ORDER]],
            [
                [
                    VARIANT_LABELS[variant],
                    *[_pct(exact[variant][s]) for s in SUITE_ORDER],
                    _pct(metrics["json_schema_valid"][variant]),
                    *[_pct(metrics["agreement_with_fp32"][variant][s]) for s in SUITE_ORDER],
                ]
                for variant in VARIANTS
            ],
        ),
        "",
        "First 100 items of each test split (what the fast tests re-measure):",
        "",
        *_table(
            ["variant", *SUITE_ORDER],
            [
                [variant, *[_pct(metrics["exact_match_first_100"][variant][s]) for s in SUITE_ORDER]]
                for variant in VARIANTS
            ],
        ),
        "",
        *_boundary_lines(metrics),
    ]


def _training_section(metrics: dict[str, Any]) -> list[str]:
    """Training, how to reproduce it, and the limitations."""
    recipe = metrics["recipe"]
    return [
        "## Training",
        "",
        *_table(
            ["field", "value"],
            [
                [
                    "data",
                    "generated on the fly from the three task formats; every test and calibration "
                    "operand pair and code is held out",
                ],
                ["task mix", ", ".join(f"{k} {v:.0%}" for k, v in recipe["task_mix"].items())],
                ["arith without <bos>", f"{recipe['no_bos_share']:.0%} (left truncation may drop it)"],
                ["loss", "cross-entropy on the completion and <eos> only"],
                ["steps x batch", f"{recipe['steps']} x {recipe['batch_size']}"],
                [
                    "optimizer",
                    f"AdamW, peak lr {recipe['learning_rate']}, weight decay {recipe['weight_decay']}, "
                    f"{recipe['warmup_steps']} warm-up steps, cosine to 10%",
                ],
                ["seed", str(recipe["seed"])],
                ["threads", str(metrics["environment"]["threads"])],
                [
                    "training time",
                    _training_time(metrics),
                ],
            ],
        ),
        "",
        "## Reproduce",
        "",
        f"`gate zoo build {metrics['model']}` retrains from the same seed and writes the same files; on the "
        "same torch build and thread count the weights are identical, elsewhere the metrics agree within a "
        "few points (the slow test `tests/zoo/test_zoo_rebuild.py` checks 2 points).",
        "",
        "## Limitations",
        "",
        "A toy by design: it knows three formats, has no general language ability, and answers anything else "
        "with noise. Use it to check serving, never to answer questions.",
        "",
    ]
