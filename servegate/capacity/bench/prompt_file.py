"""Prompt files: the exact prompts a bench sends, in order, so another load generator can replay the same ones.

One JSON object a line: `{"prompt": "...", "max_tokens": 16}`. `output_tokens_count` (guidellm's column
name) is read as `max_tokens` when that is absent, so one file feeds `gate bench --prompts` and guidellm's
`--data kind=json_file,path=FILE.jsonl` alike.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from servegate.capacity.bench.workload import RequestSpec
from servegate.contracts.errors import ServegateError

CHARS_PER_TOKEN = 4.0
"""Without a tokenizer a prompt's requested length is its characters / 4 (the bench's usual approximation)."""


@dataclass(frozen=True)
class FilePrompt:
    """One line of a prompt file."""

    text: str
    """The prompt, sent as is."""
    prompt_tokens: int
    """Its length in tokens: the tokenizer's count (special tokens included), else characters / 4."""
    max_tokens: int
    """Output tokens asked for."""


def _max_tokens(row: dict[str, Any], where: str) -> int:
    value = row.get("max_tokens", row.get("output_tokens_count"))
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ServegateError(f"{where}: give max_tokens as a whole number >= 1 (got {value!r})")
    return value


def load_prompt_file(path: Path, tokenizer: Any = None) -> list[FilePrompt]:
    """The prompts of a JSONL file in order; a line that is not `{"prompt": str, "max_tokens": int}` is an error."""
    if not path.is_file():
        raise ServegateError(f"--prompts {path}: file not found")
    prompts: list[FilePrompt] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ServegateError(f"{where}: not JSON ({exc.msg}); write one object a line") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ServegateError(f'{where}: write {{"prompt": "some text", "max_tokens": 16}} (a non-empty prompt)')
        text = row["prompt"]
        if tokenizer is not None:
            tokens = len(tokenizer(text)["input_ids"])
        else:
            tokens = max(1, round(len(text) / CHARS_PER_TOKEN))
        prompts.append(FilePrompt(text, tokens, _max_tokens(row, where)))
    if not prompts:
        raise ServegateError(f"--prompts {path}: the file holds no prompt")
    return prompts


def with_prompts(specs: Sequence[RequestSpec], prompts: Sequence[FilePrompt]) -> list[RequestSpec]:
    """The specs' arrivals carrying the file's prompts in order (the i-th request sends the i-th prompt)."""
    if len(specs) > len(prompts):
        raise ServegateError(
            f"the prompt file holds {len(prompts)} prompts; a run of {len(specs)} requests needs as many "
            "(give --requests at most that, or more lines)"
        )
    return [
        replace(spec, prompt_tokens=p.prompt_tokens, output_tokens=p.max_tokens, text=p.text)
        for spec, p in zip(specs, prompts, strict=False)
    ]
