"""Sibling projections as one oneDNN product: the same bits as one product per linear, one call per group, nothing
held between calls, and a replaced weight honoured."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from support.models import assert_routing_decodes_as_before, tiny_llama

from servegate.runtime.model import fused_linear
from servegate.runtime.model.cpu_linear import apply_cpu_linear
from servegate.runtime.model.fused_linear import fused_groups, route_linears_onednn
from servegate.runtime.model.onednn_linear import onednn_available

pytestmark = [
    pytest.mark.skipif(not onednn_available(), reason="torch has no oneDNN"),
    pytest.mark.usefixtures("keep_torch_threads"),
]


class Siblings(torch.nn.Module):
    """q/k/v and gate/up as transformers' layers name them, called on one input each."""

    def __init__(self, bias: bool, widths: tuple[int, int, int] = (48, 16, 16)) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(32, width, bias=bias) for width in widths)
        self.gate_proj = torch.nn.Linear(32, 40, bias=bias)
        self.up_proj = torch.nn.Linear(32, 40, bias=bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.q_proj(x), self.k_proj(x), self.v_proj(x), self.gate_proj(x) * self.up_proj(x)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(32,), (1, 32), (7, 32), (2, 5, 32)])
def test_fused_siblings_give_bitwise_what_each_linear_gives_on_its_own(
    dtype: torch.dtype, bias: bool, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(3)
    fused = Siblings(bias).to(dtype)
    separate = copy.deepcopy(fused)
    x = torch.randn(*shape).to(dtype)
    dense = [F.linear(x, m.weight, m.bias) for m in (fused.q_proj, fused.k_proj, fused.v_proj)]
    assert route_linears_onednn(fused) == 5
    assert route_linears_onednn(separate, fuse_projections=False) == 5
    assert len(fused_groups(fused)) == 2 and fused_groups(separate) == []
    with torch.inference_mode():
        got, want = fused(x), separate(x)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == dtype
        assert torch.equal(a, b)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for a, b in zip(got[:3], dense, strict=True):
        torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)


def test_a_group_runs_one_product_per_input_and_keeps_nothing_after(monkeypatch: pytest.MonkeyPatch) -> None:
    layer = Siblings(bias=False)
    route_linears_onednn(layer)
    calls = []
    real = fused_linear.packed_product
    monkeypatch.setattr(fused_linear, "packed_product", lambda *a: calls.append(a[0].shape) or real(*a))
    x, y = torch.randn(3, 32), torch.randn(3, 32)
    with torch.inference_mode():
        layer(x)
        assert len(calls) == 2  # one for q/k/v, one for gate/up
        assert all(
            g.held.source is None and g.held.result is None for g in fused_groups(layer)
        )  # released once all took
        layer(y)
        assert len(calls) == 4
        layer.q_proj(x)
        q_again = layer.q_proj(x)  # before its siblings took theirs: a fresh product, not the one q already took
        assert len(calls) == 6
        k, v = layer.k_proj(x), layer.v_proj(x)  # they take theirs from the waiting product
        assert len(calls) == 6
    assert all(g.held.source is None and g.held.result is None for g in fused_groups(layer))
    group = next(g for g in fused_groups(layer) if len(g.members) == 3)
    for got, member in ((q_again, 0), (k, 1), (v, 2)):
        torch.testing.assert_close(got, F.linear(x, group.dense(member)), rtol=1e-5, atol=1e-5)


def test_each_thread_holds_its_own_product(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    layer = Siblings(bias=False)
    route_linears_onednn(layer)
    calls = []
    real = fused_linear.packed_product
    monkeypatch.setattr(fused_linear, "packed_product", lambda *a: calls.append(1) or real(*a))
    x, y = torch.randn(2, 32), torch.randn(3, 32)
    with torch.inference_mode():
        q = layer.q_proj(x)  # this thread's product now waits for k and v

        def other_thread() -> None:
            with torch.inference_mode():
                layer.q_proj(y), layer.k_proj(y), layer.v_proj(y)

        worker = threading.Thread(target=other_thread)
        worker.start()
        worker.join()
        k, v = layer.k_proj(x), layer.v_proj(x)
    assert len(calls) == 2  # one product per thread: the other thread's left this one's alone
    group = next(g for g in fused_groups(layer) if len(g.members) == 3)
    for got, member in ((q, 0), (k, 1), (v, 2)):
        torch.testing.assert_close(got, F.linear(x, group.dense(member)), rtol=1e-5, atol=1e-5)


def test_the_dense_weights_are_released_and_keep_their_shapes() -> None:
    layer = Siblings(bias=True)
    route_linears_onednn(layer)
    for member in (layer.q_proj, layer.k_proj, layer.v_proj, layer.gate_proj, layer.up_proj):
        assert member.weight.untyped_storage().nbytes() == 4
        assert member.weight.shape == (member.out_features, 32)


def test_a_replaced_weight_dissolves_the_group_and_is_used() -> None:
    torch.manual_seed(4)
    layer = Siblings(bias=False)
    original_q = layer.q_proj.weight.detach().clone()
    route_linears_onednn(layer)
    new_k = torch.randn(16, 32)
    layer.k_proj.weight = torch.nn.Parameter(new_k)
    x = torch.randn(2, 32)
    with torch.inference_mode():
        torch.testing.assert_close(layer.k_proj(x), F.linear(x, new_k), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.q_proj(x), F.linear(x, original_q), rtol=1e-5, atol=1e-5)
    assert len(fused_groups(layer)) == 1  # gate/up stay fused; q/k/v went back to one product each
    assert not hasattr(layer.q_proj, "_servegate_fused") and hasattr(layer.q_proj, "_servegate_onednn")


def test_a_model_converted_after_routing_is_refused_not_served_zeros() -> None:
    layer = Siblings(bias=False)
    route_linears_onednn(layer)
    layer.to(torch.bfloat16)  # every released placeholder comes back as a dense tensor of zeros
    with pytest.raises(ValueError, match="placeholder or all zeros"), torch.inference_mode():
        layer.q_proj(torch.randn(2, 32, dtype=torch.bfloat16))


def test_autograd_and_other_dtypes_take_the_dense_path() -> None:
    torch.manual_seed(5)
    layer = Siblings(bias=True)
    weight, bias = layer.v_proj.weight.detach().clone(), layer.v_proj.bias.detach().clone()
    route_linears_onednn(layer)
    x = torch.randn(2, 32, requires_grad=True)
    out = layer.v_proj(x)
    torch.testing.assert_close(out, F.linear(x, weight, bias), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert x.grad is not None
    with torch.inference_mode():
        doubled = layer.v_proj(x.detach().double())
    assert doubled.dtype == torch.float64


def test_siblings_that_differ_are_routed_one_by_one() -> None:
    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.q_proj = torch.nn.Linear(32, 16, bias=True)
            self.k_proj = torch.nn.Linear(32, 16, bias=False)  # no bias where q has one
            self.v_proj = torch.nn.Linear(32, 16, bias=True)
            self.gate_proj = torch.nn.Linear(32, 16)
            self.up_proj = torch.nn.Linear(24, 16)  # another input width

    layer = Mixed()
    assert route_linears_onednn(layer) == 5
    assert fused_groups(layer) == []
    assert all(hasattr(m, "_servegate_onednn") for m in layer.children())


def test_the_runtime_fuses_a_llamas_projections_and_decodes_as_before() -> None:
    model = tiny_llama()
    assert apply_cpu_linear(model, "onednn", 1) == 2 * 7 + 1
    assert len(fused_groups(model)) == 2 * 2  # q/k/v and gate/up in each of the 2 layers
    assert_routing_decodes_as_before(route_linears_onednn)


def test_a_fused_llama_gives_the_same_logits_as_one_routed_linear_by_one() -> None:
    model = tiny_llama(num_key_value_heads=2)
    separate = copy.deepcopy(model)
    route_linears_onednn(model)
    route_linears_onednn(separate, fuse_projections=False)
    ids = torch.tensor([[5, 9, 2, 44, 17, 3], [1, 2, 3, 4, 5, 6]])
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, separate(ids).logits)
    assert torch.equal(
        model.generate(ids, max_new_tokens=8, do_sample=False),
        separate.generate(ids, max_new_tokens=8, do_sample=False),
    )
