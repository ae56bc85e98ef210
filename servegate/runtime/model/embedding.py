"""`task: embed`: an encoder model plus the pooling its sentence-transformers config declares.

The pooling is read from the checkpoint, not chosen here: `1_Pooling/config.json` (cls, mean, max,
mean_sqrt_len, lasttoken; several are concatenated in sentence-transformers' order) and a Normalize
module listed in `modules.json` (L2 normalisation). A checkpoint without that config is mean-pooled.
Inputs follow the manifest's `max_input_tokens` and `truncation` like prompts do.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from servegate.contracts.errors import ServegateError, ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model.cpu_linear import use_torch_threads
from servegate.runtime.model.weights import (
    check_weight_format,
    resolve_device,
    resolve_dtype,
    resolve_weights_dir,
    verify_checksums,
)
from servegate.runtime.preprocess import truncate

POOLING_ORDER = ("cls_token", "max_tokens", "mean_tokens", "mean_sqrt_len_tokens", "lasttoken")
"""Pooling modes in the order sentence-transformers concatenates them."""


@dataclass(frozen=True)
class Pooling:
    """How token states become one vector."""

    modes: tuple[str, ...] = ("mean_tokens",)
    normalize: bool = False
    max_seq_length: int | None = None


@dataclass(frozen=True)
class EmbeddingBatch:
    """Vectors of a batch of texts and their token counts."""

    vectors: list[list[float]]
    prompt_tokens: list[int]
    truncated_tokens: list[int]


def read_pooling(directory: Path) -> Pooling:
    """The pooling a sentence-transformers checkpoint declares (mean, unnormalised, when it declares none)."""
    modules_path = directory / "modules.json"
    modules = json.loads(modules_path.read_text(encoding="utf-8")) if modules_path.is_file() else []
    normalize = any(str(m.get("type", "")).endswith(".Normalize") for m in modules)
    pooling_dir = next((m.get("path", "") for m in modules if str(m.get("type", "")).endswith(".Pooling")), "1_Pooling")
    config_path = directory / pooling_dir / "config.json"
    modes: tuple[str, ...] = ("mean_tokens",)
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        modes = tuple(m for m in POOLING_ORDER if config.get(f"pooling_mode_{m}"))
        if not modes:
            raise ServegateError(
                f"{config_path} enables no pooling mode this runtime knows ({', '.join(POOLING_ORDER)})"
            )
    st_config = directory / "sentence_bert_config.json"
    max_len = json.loads(st_config.read_text(encoding="utf-8")).get("max_seq_length") if st_config.is_file() else None
    return Pooling(modes, normalize, max_len)


def pool(states: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """states [B, L, H] and attention mask [B, L] -> vectors [B, H * len(modes)]."""
    weights = mask.unsqueeze(-1).to(states.dtype)  # [B, L, 1]
    counts = weights.sum(dim=1).clamp(min=1e-9)  # [B, 1]
    parts = []
    for mode in pooling.modes:
        if mode == "cls_token":
            parts.append(states[:, 0])
        elif mode == "max_tokens":
            parts.append(states.masked_fill(weights == 0, -1e9).max(dim=1).values)
        elif mode == "mean_tokens":
            parts.append((states * weights).sum(dim=1) / counts)
        elif mode == "mean_sqrt_len_tokens":
            parts.append((states * weights).sum(dim=1) / counts.sqrt())
        else:  # lasttoken: the last non-padding position (right padding)
            last = mask.sum(dim=1).long() - 1
            parts.append(states[torch.arange(states.shape[0], device=states.device), last])
    vectors = torch.cat(parts, dim=-1)
    return torch.nn.functional.normalize(vectors, p=2, dim=-1) if pooling.normalize else vectors


class EmbeddingModel:
    """Embeds texts with the manifest's encoder, pooling and input limits."""

    def __init__(self, served: ServedModel, *, batch_size: int | None = None) -> None:
        from transformers import AutoModel, AutoTokenizer

        directory = resolve_weights_dir(served)
        verify_checksums(directory, served.weights.sha256)
        use_safetensors = check_weight_format(directory, served.weights.allow_pickle)
        use_torch_threads(served.runtime.threads)
        self.device = resolve_device(served.runtime.device)
        self.dtype = resolve_dtype(served.runtime.dtype, self.device)
        load_dtype = "auto" if served.weights.dtype == "auto" else getattr(torch, served.weights.dtype)
        try:
            model = AutoModel.from_pretrained(
                directory, dtype=load_dtype, use_safetensors=use_safetensors, local_files_only=True
            )
            self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:  # unpickling: weights_only refusal
            raise ServegateError(f"cannot load an encoder from {directory}: {str(exc).splitlines()[0]}") from None
        self.model: Any = model.to(device=self.device, dtype=self.dtype).eval()
        self.quantization = None
        if served.runtime.quantization.method != "none":
            from servegate.runtime.model.quantization import quantize_model

            self.quantization = quantize_model(self.model, served.runtime.quantization)
        self.pooling = read_pooling(directory)
        limits = [served.preprocess.max_input_tokens, served.runtime.max_model_len]
        limits += [
            n for n in (self.pooling.max_seq_length, getattr(model.config, "max_position_embeddings", None)) if n
        ]
        self.max_tokens = min(limits)
        self.truncation = served.preprocess.truncation
        self.batch_size = batch_size or served.batching.max_batch_size

    @property
    def dimension(self) -> int:
        """Length of every vector."""
        return int(self.model.config.hidden_size) * len(self.pooling.modes)

    def tokenize(self, text: str) -> tuple[list[int], int]:
        """Token ids of one text with the model's special tokens, truncated as the manifest says: (ids, dropped)."""
        if not isinstance(text, str):
            raise ServingError("invalid_request", param="input", detail="every input must be a string")
        encoded = self.tokenizer(text, return_special_tokens_mask=True)
        ids, special = list(encoded["input_ids"]), list(encoded["special_tokens_mask"])
        # the special tokens the tokenizer wraps every text in ([CLS] ... [SEP]) survive truncation
        head = next((i for i, s in enumerate(special) if not s), len(ids))
        tail = next((i for i, s in enumerate(reversed(special[head:])) if not s), 0)
        body = ids[head : len(ids) - tail]
        room = self.max_tokens - head - tail
        if len(body) > room and self.truncation == "reject":
            raise ServingError("input_too_long", param="input", tokens=len(ids), limit=self.max_tokens)
        kept, dropped = truncate(body, room, "right" if self.truncation == "reject" else self.truncation)
        return ids[:head] + kept + ids[len(ids) - tail :], dropped

    def encode(self, texts: Sequence[str]) -> EmbeddingBatch:
        """Vectors and token counts for `texts`, computed in batches of batch_size."""
        encoded = [self.tokenize(t) for t in texts]
        vectors: list[list[float]] = []
        for start in range(0, len(encoded), self.batch_size):
            vectors.extend(self._forward([ids for ids, _ in encoded[start : start + self.batch_size]]))
        return EmbeddingBatch(vectors, [len(ids) for ids, _ in encoded], [dropped for _, dropped in encoded])

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector per text."""
        return self.encode(texts).vectors

    @torch.inference_mode()
    def _forward(self, batch: list[list[int]]) -> list[list[float]]:
        width = max(len(ids) for ids in batch)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids in batch], device=self.device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids in batch], device=self.device)
        states = self.model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return pool(states.float(), mask, self.pooling).cpu().tolist()
