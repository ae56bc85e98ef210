"""Quantization: torchao where it runs, simulated where not, lm_head/embeddings kept unless asked."""

from __future__ import annotations

import copy

import pytest
import torch
import transformers as hf
from support.models import tiny_llama

from servegate.contracts.sections import Quantization
from servegate.runtime.model import quantization as quant
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.model.quantization import quantize_model, round_trip
from servegate.runtime.types import SeqChunk

METHODS = ["int8-weight", "int8-dynamic", "int4-weight", "fp8-weight", "int3-weight", "int2-weight"]
LINEARS = 2 * 7  # 2 layers x (q, k, v, o, gate, up, down); lm_head excluded


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def base() -> hf.LlamaForCausalLM:
    return tiny_llama()


def logits(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(ids).logits[0]


@pytest.mark.parametrize("method", METHODS)
def test_each_method_quantizes_the_linear_layers_only(base: hf.LlamaForCausalLM, method: str) -> None:
    model = copy.deepcopy(base)
    report = quantize_model(model, Quantization(method=method))
    expected_backend = "simulated" if method in ("int3-weight", "int2-weight") else "torchao"
    assert (report.method, report.backend, report.simulated) == (
        method,
        expected_backend,
        expected_backend != "torchao",
    )
    assert report.modules_quantized == LINEARS
    assert report.weight_bytes_after < report.weight_bytes_before
    assert torch.equal(model.lm_head.weight, base.lm_head.weight)
    assert torch.equal(model.model.embed_tokens.weight, base.model.embed_tokens.weight)
    ids = torch.randint(3, 101, (1, 16), generator=torch.Generator().manual_seed(1))
    before, after = logits(base, ids), logits(model, ids)
    assert not torch.equal(before, after)
    floor = 0.5 if method == "int2-weight" else 0.9  # two bits keep only the rough shape
    assert torch.nn.functional.cosine_similarity(before, after, dim=-1).min() > floor


def test_fewer_bits_cost_more_accuracy(base: hf.LlamaForCausalLM) -> None:
    ids = torch.randint(3, 101, (1, 32), generator=torch.Generator().manual_seed(2))
    reference = logits(base, ids)
    errors = {}
    for method in ("int8-weight", "int4-weight", "int2-weight"):
        model = copy.deepcopy(base)
        quantize_model(model, Quantization(method=method))
        errors[method] = float((logits(model, ids) - reference).abs().mean())
    assert errors["int8-weight"] < errors["int4-weight"] < errors["int2-weight"]


def test_lm_head_and_embeddings_on_request(base: hf.LlamaForCausalLM) -> None:
    model = copy.deepcopy(base)
    report = quantize_model(model, Quantization(method="int4-weight", include_lm_head=True, include_embeddings=True))
    assert report.modules_quantized == LINEARS + 2
    assert report.simulated and report.simulated_modules == 1  # the embedding table is round-tripped
    assert not torch.equal(model.model.embed_tokens.weight, base.model.embed_tokens.weight)
    hidden = torch.randn(2, 64)
    with torch.inference_mode():
        assert not torch.allclose(model.lm_head(hidden), base.lm_head(hidden))


def test_tied_head_stays_exact_when_only_embeddings_are_quantized() -> None:
    model = tiny_llama(intermediate_size=64, num_hidden_layers=1, num_key_value_heads=4, tie_word_embeddings=True)
    head = model.lm_head.weight.detach().clone()
    quantize_model(model, Quantization(method="int8-weight", include_embeddings=True))
    assert torch.equal(model.lm_head.weight, head)
    assert not torch.equal(model.model.embed_tokens.weight, head)


def test_simulated_when_torchao_cannot_run(base: hf.LlamaForCausalLM, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(quant, "_torchao_runs", lambda *args: False)
    ids = torch.randint(3, 101, (1, 16), generator=torch.Generator().manual_seed(3))
    for method in ("int8-dynamic", "fp8-weight"):
        model = copy.deepcopy(base)
        report = quantize_model(model, Quantization(method=method))
        assert (report.backend, report.simulated, report.simulated_modules) == ("simulated", True, LINEARS)
        assert type(model.model.layers[0].mlp.up_proj.weight) is torch.nn.Parameter
        out = logits(model, ids)
        assert torch.nn.functional.cosine_similarity(out, logits(base, ids), dim=-1).min() > 0.9


@pytest.mark.parametrize(("method", "levels"), [("int2-weight", 4), ("int3-weight", 8), ("int4-weight", 16)])
def test_round_trip_uses_the_formats_levels(method: str, levels: int) -> None:
    weight = torch.randn(4, 64)
    rounded = round_trip(weight, method, group_size=32)
    for row in range(4):
        for group in (slice(0, 32), slice(32, 64)):
            assert torch.unique(rounded[row, group]).numel() <= levels
    assert (rounded - weight).abs().max() < weight.abs().max()


def test_none_changes_nothing(base: hf.LlamaForCausalLM) -> None:
    model = copy.deepcopy(base)
    report = quantize_model(model, Quantization())
    assert (report.backend, report.modules_quantized) == ("none", 0)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, base.model.layers[0].mlp.up_proj.weight)


@pytest.mark.parametrize("method", ["int8-dynamic", "int4-weight", "int2-weight"])
def test_quantized_model_runs_in_the_paged_runner(base: hf.LlamaForCausalLM, method: str) -> None:
    model = copy.deepcopy(base)
    quantize_model(model, Quantization(method=method))
    ids = torch.randint(3, 101, (1, 12), generator=torch.Generator().manual_seed(4))
    full = logits(model, ids)
    runner = PagedModelRunner(model, num_blocks=8, block_size=4)
    prompt = tuple(ids[0].tolist())
    table = (5, 2, 7)
    got = [runner.execute([SeqChunk(0, prompt[:9], 0, table)])[0]]
    got += [runner.execute([SeqChunk(0, (prompt[p],), p, table)])[0] for p in range(9, 12)]
    assert torch.allclose(torch.stack(got), full[8:12], atol=1e-4)
