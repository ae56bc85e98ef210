"""Linear layers through oneDNN's packed weights: F.linear's results, the dense copy released, ties left alone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.models import assert_routing_decodes_as_before, tiny_llama

from servegate.contracts import sections
from servegate.runtime.model import cpu_linear
from servegate.runtime.model.cpu_linear import apply_cpu_linear
from servegate.runtime.model.fused_linear import route_linears_onednn
from servegate.runtime.model.onednn_linear import onednn_available, packable_linears

pytestmark = [
    pytest.mark.skipif(not onednn_available(), reason="torch has no oneDNN"),
    pytest.mark.usefixtures("keep_torch_threads"),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(64,), (1, 64), (5, 64), (2, 3, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_packed_linear_matches_torch(dtype: torch.dtype, shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 48, bias=bias).to(dtype)
    x = torch.randn(*shape).to(dtype)
    expected = F.linear(x, layer.weight, layer.bias)
    assert route_linears_onednn(layer) == 1
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == expected.shape and got.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


def test_a_non_contiguous_input_gives_the_same_rows() -> None:
    torch.manual_seed(2)
    layer = torch.nn.Linear(32, 16, bias=False)
    x = torch.randn(32, 6).t()  # [6, 32], strided
    expected = F.linear(x, layer.weight)
    route_linears_onednn(layer)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)


def test_the_dense_weight_is_released_but_keeps_its_shape() -> None:
    layer = torch.nn.Linear(256, 128, bias=False)
    route_linears_onednn(layer)
    weight = layer.weight
    assert weight.shape == (128, 256) and weight.dtype == torch.float32
    assert weight.untyped_storage().nbytes() == 4  # one element left: the layer holds its weight once, packed
    assert weight.numel() * weight.element_size() == 128 * 256 * 4  # what memory accounting reads is unchanged


def test_a_tied_head_stays_dense_and_unrouted() -> None:
    model = tiny_llama()
    model.lm_head.weight = model.model.embed_tokens.weight  # tie, as SmolLM2's config does
    linears = packable_linears(model)
    assert model.lm_head not in linears and len(linears) == 2 * 7
    ids = torch.tensor([[5, 9, 2, 44, 17, 3]])
    before = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert route_linears_onednn(model) == 2 * 7
    assert model.model.embed_tokens.weight.untyped_storage().nbytes() > 4  # the embedding still reads it
    assert torch.equal(model.generate(ids, max_new_tokens=8, do_sample=False), before)


def test_a_routed_model_decodes_as_before() -> None:
    assert_routing_decodes_as_before(route_linears_onednn)


def test_autograd_still_gets_the_right_product() -> None:
    torch.manual_seed(3)
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    expected = F.linear(x, layer.weight, layer.bias).detach()
    route_linears_onednn(layer)
    out = layer(x)
    out.sum().backward()  # the packed op has no backward: the rare path unpacks the weight
    torch.testing.assert_close(out.detach(), expected, rtol=1e-5, atol=1e-5)
    assert x.grad is not None


def test_a_replaced_weight_is_packed_again() -> None:
    layer = torch.nn.Linear(8, 4, bias=False)
    route_linears_onednn(layer)
    x = torch.randn(2, 8)
    layer.weight = torch.nn.Parameter(torch.ones(4, 8))
    with torch.inference_mode():
        assert torch.allclose(layer(x), x.sum(-1, keepdim=True).expand(2, 4))
    assert layer.weight.untyped_storage().nbytes() == 4  # and released in turn


def test_converting_after_packing_is_refused_not_served_as_zeros() -> None:
    layer = torch.nn.Linear(8, 4, bias=False)
    route_linears_onednn(layer)
    layer.to(torch.bfloat16)  # the placeholder converts; the packed float32 weight cannot follow
    with pytest.raises(ValueError, match="converted"), torch.inference_mode():
        layer(torch.randn(2, 8, dtype=torch.bfloat16))


def test_only_float32_and_bfloat16_weights_are_packed() -> None:
    assert route_linears_onednn(tiny_llama().to(torch.float64)) == 0
    assert route_linears_onednn(tiny_llama().to(torch.bfloat16)) == 2 * 7 + 1


def test_apply_keeps_torchs_threads_for_onednn() -> None:
    torch.set_num_threads(2)
    assert apply_cpu_linear(tiny_llama(), "onednn", 2) == 2 * 7 + 1
    assert torch.get_num_threads() == 2  # oneDNN runs on torch's own OpenMP pool


def test_auto_packs_a_large_bfloat16_model_only(monkeypatch: pytest.MonkeyPatch) -> None:
    assert apply_cpu_linear(tiny_llama().to(torch.bfloat16), "auto", None) == 0  # 0.1 MB: stays in cache
    # as if its weights streamed from memory: the bfloat16 rule (sections.auto_packs_for_onednn) and float32's
    monkeypatch.setattr(sections, "AUTO_MIN_WEIGHT_BYTES", 1)
    monkeypatch.setattr(cpu_linear, "AUTO_MIN_WEIGHT_BYTES", 1)
    assert apply_cpu_linear(tiny_llama().to(torch.bfloat16), "auto", None) == 2 * 7 + 1
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: "GenuineIntel")
    assert apply_cpu_linear(tiny_llama(), "auto", None) == 0  # float32 on Intel: torch's own


def test_onednn_without_onednn_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    with pytest.raises(ValueError, match="no oneDNN"):
        cpu_linear.resolve_cpu_linear("onednn", torch.device("cpu"), torch.float32, weight_bytes=2**20)


def test_compile_decode_takes_onednn_for_its_eager_steps_but_not_openblas() -> None:
    from pydantic import ValidationError

    from servegate.contracts.manifest import ServedModel

    def manifest(linear: str) -> ServedModel:
        return ServedModel.model_validate(
            {
                "name": "t",
                "weights": {"source": "zoo:tiny-primary"},
                "runtime": {"compile": "decode", "cpu_linear": linear},
            }
        )

    assert manifest("onednn").runtime.cpu_linear == "onednn"
    with pytest.raises(ValidationError, match="cpu_linear: openblas takes down to one"):
        manifest("openblas")
