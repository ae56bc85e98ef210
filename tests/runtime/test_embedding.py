"""Embeddings: the checkpoint's own pooling, matching sentence-transformers, and the input limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model import cpu_linear
from servegate.runtime.model.embedding import EmbeddingModel, Pooling, pool, read_pooling

TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an instrument on stage.",
    "The stock market fell sharply today.",
    "hi",
]


def minilm_dir() -> Path:
    zoo = pytest.importorskip("servegate.zoo")
    try:
        return Path(zoo.zoo_model_path("minilm"))
    except zoo.ZooError as exc:
        pytest.skip(f"zoo:minilm not installed: {exc}")


def minilm(**preprocess: object) -> ServedModel:
    minilm_dir()
    return ServedModel.model_validate(
        {
            "name": "minilm",
            "weights": {"source": "zoo:minilm"},
            "preprocess": {"task": "embed", "max_input_tokens": 256, "truncation": "right", **preprocess},
            "runtime": {"max_model_len": 512},
            "batching": {"mode": "dynamic", "max_batch_size": 3},
            "postprocess": {"max_output_tokens": 1},
        }
    )


@pytest.fixture(scope="module")
def model() -> EmbeddingModel:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield EmbeddingModel(minilm())
    torch.set_num_threads(threads)


def test_torch_threads_follow_the_manifest_not_an_earlier_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", 6)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # what a generation model routed to OpenBLAS leaves behind
        EmbeddingModel(minilm())
        assert torch.get_num_threads() == 3  # no runtime.threads: the default again, half the cores
        served = minilm()
        EmbeddingModel(served.model_copy(update={"runtime": served.runtime.model_copy(update={"threads": 2})}))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_minilm_pooling_is_read_from_its_config() -> None:
    assert read_pooling(minilm_dir()) == Pooling(("mean_tokens",), normalize=True, max_seq_length=256)


def test_vectors_match_sentence_transformers(model: EmbeddingModel) -> None:
    st = pytest.importorskip("sentence_transformers")
    reference = st.SentenceTransformer(str(minilm_dir()), device="cpu").encode(TEXTS, convert_to_tensor=True)
    ours = torch.tensor(model.embed(TEXTS))
    assert ours.shape == (4, 384) == (len(TEXTS), model.dimension)
    assert torch.nn.functional.cosine_similarity(ours, reference.float(), dim=-1).min() > 0.999
    assert torch.allclose(ours.norm(dim=-1), torch.ones(4), atol=1e-5)


def test_batching_does_not_change_vectors(model: EmbeddingModel) -> None:
    together = torch.tensor(model.embed(TEXTS))  # batches of 3 + 1, with padding
    alone = torch.tensor([model.embed([t])[0] for t in TEXTS])
    assert torch.allclose(together, alone, atol=1e-5)
    paraphrase, unrelated = together[0] @ together[1], together[0] @ together[2]
    assert paraphrase > unrelated


def test_long_inputs_follow_the_truncation_policy(model: EmbeddingModel) -> None:
    long_text = "word " * 400
    batch = model.encode([long_text, "short"])
    assert batch.prompt_tokens[0] == 256 and batch.truncated_tokens[0] == 400 - 254
    assert batch.truncated_tokens[1] == 0
    strict = EmbeddingModel(minilm(truncation="reject"))
    with pytest.raises(ServingError) as err:
        strict.embed([long_text])
    assert (err.value.code, err.value.param) == ("input_too_long", "input")


def test_pooling_modes() -> None:
    states = torch.tensor([[[1.0, 0.0], [3.0, 4.0], [9.0, 9.0]]])
    mask = torch.tensor([[1, 1, 0]])
    assert pool(states, mask, Pooling(("mean_tokens",))).tolist() == [[2.0, 2.0]]
    assert pool(states, mask, Pooling(("cls_token",))).tolist() == [[1.0, 0.0]]
    assert pool(states, mask, Pooling(("max_tokens",))).tolist() == [[3.0, 4.0]]
    assert pool(states, mask, Pooling(("lasttoken",))).tolist() == [[3.0, 4.0]]
    assert pool(states, mask, Pooling(("cls_token", "max_tokens"))).tolist() == [[1.0, 0.0, 3.0, 4.0]]
    normed = pool(states, mask, Pooling(("max_tokens",), normalize=True))
    assert torch.allclose(normed, torch.tensor([[0.6, 0.8]]))


def test_checkpoint_without_sentence_transformers_config_is_mean_pooled(tmp_path: Path) -> None:
    assert read_pooling(tmp_path) == Pooling()
    (tmp_path / "modules.json").write_text(json.dumps([{"path": "pool", "type": "x.Pooling"}]))
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert read_pooling(tmp_path) == Pooling(("cls_token",))
