"""Helpers of the zoo tests: each trained model loaded once, the way a user loads it."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from servegate.zoo import zoo_model_path

TRAINED = ("tiny-primary", "tiny-fallback")


@cache
def load_causal(name: str) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Model and tokenizer of a zoo causal LM through the plain Auto classes, offline."""
    torch.set_num_threads(2)
    path = zoo_model_path(name)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model, tokenizer


@cache
def recorded_metrics(name: str) -> dict[str, Any]:
    """The metrics.json written when the model was built (what its datasheet shows)."""
    metrics: dict[str, Any] = json.loads((zoo_model_path(name) / "metrics.json").read_text(encoding="utf-8"))
    return metrics
