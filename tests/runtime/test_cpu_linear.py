"""Linear layers through OpenBLAS: same results as F.linear, falls back where it must, and the pools are sized."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.models import assert_routing_decodes_as_before, tiny_llama
from threadpoolctl import threadpool_info

from servegate.contracts.sections import Quantization
from servegate.runtime.model import cpu_linear
from servegate.runtime.model.cpu_linear import (
    AUTO_MIN_WEIGHT_BYTES,
    apply_cpu_linear,
    cpu_vendor,
    resolve_cpu_linear,
    route_linears,
)
from servegate.runtime.model.quantization import quantize_model

pytestmark = pytest.mark.skipif(cpu_linear.numpy_blas() != "openblas", reason="numpy is not built on OpenBLAS")


@pytest.fixture(autouse=True)
def keep_thread_settings():
    threads = torch.get_num_threads()
    blas = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    yield
    torch.set_num_threads(threads)
    if blas:
        cpu_linear.set_blas_threads(blas[0])


@pytest.mark.parametrize("shape", [(64,), (1, 64), (5, 64), (2, 3, 64)])
@pytest.mark.parametrize("bias", [True, False])
def test_routed_linear_matches_torch(shape: tuple[int, ...], bias: bool) -> None:
    torch.manual_seed(1)
    layer = torch.nn.Linear(64, 48, bias=bias)
    x = torch.randn(*shape)
    expected = F.linear(x, layer.weight, layer.bias)
    assert route_linears(layer) == 1
    with torch.inference_mode():
        got = layer(x)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_autograd_falls_back_to_torch() -> None:
    torch.manual_seed(2)
    layer = torch.nn.Linear(16, 8)
    route_linears(layer)
    x = torch.randn(3, 16, requires_grad=True)
    layer(x).sum().backward()  # the numpy path would have cut the graph
    assert x.grad is not None and layer.weight.grad is not None


def test_a_replaced_or_moved_weight_is_read_again() -> None:
    layer = torch.nn.Linear(8, 4, bias=False)
    route_linears(layer)
    x = torch.randn(2, 8)
    with torch.inference_mode():
        layer(x)
        layer.weight = torch.nn.Parameter(torch.ones(4, 8))
        assert torch.equal(layer(x), x.sum(-1, keepdim=True).expand(2, 4))


def test_only_plain_float32_weights_are_routed() -> None:
    model = tiny_llama()
    quantize_model(model, Quantization(method="int8-weight"))  # lm_head stays float32
    assert route_linears(model) == 1
    assert route_linears(tiny_llama().to(torch.bfloat16)) == 0
    assert route_linears(tiny_llama().to(torch.float64)) == 2 * 7 + 1  # dgemm; `auto` routes float32 only
    assert route_linears(tiny_llama()) == 2 * 7 + 1


def test_a_routed_model_decodes_as_before() -> None:
    assert_routing_decodes_as_before(route_linears)


def test_auto_routes_float32_on_cpu_except_on_intel(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: "AuthenticAMD")
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "openblas"
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=2**20) == "torch"  # in cache: not worth it
    assert resolve_cpu_linear("openblas", cpu, torch.float32, weight_bytes=2**20) == "openblas"
    assert resolve_cpu_linear("auto", cpu, torch.bfloat16, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "onednn"
    assert resolve_cpu_linear("auto", cpu, torch.bfloat16, weight_bytes=2**20) == "torch"
    assert resolve_cpu_linear("auto", cpu, torch.float16, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "torch"
    assert resolve_cpu_linear("auto", cuda, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "torch"
    assert resolve_cpu_linear("torch", cpu, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "torch"
    assert resolve_cpu_linear("onednn", cpu, torch.bfloat16, weight_bytes=2**20) == "onednn"
    assert resolve_cpu_linear("onednn", cpu, torch.float16, weight_bytes=2**20) == "torch"
    assert resolve_cpu_linear("onednn", cuda, torch.float32, weight_bytes=2**20) == "torch"
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: "GenuineIntel")
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "torch"
    assert resolve_cpu_linear("openblas", cpu, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "openblas"


def test_auto_beside_compiled_graphs_never_picks_openblas(monkeypatch: pytest.MonkeyPatch) -> None:
    # OpenBLAS would take the compiled graphs' torch threads down to one; oneDNN runs on them, so bfloat16 keeps it
    cpu = torch.device("cpu")
    monkeypatch.setattr(cpu_linear, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(cpu_linear, "numpy_blas", lambda: "openblas")
    big = AUTO_MIN_WEIGHT_BYTES
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=big) == "openblas"
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=big, compiled=True) == "torch"
    assert resolve_cpu_linear("auto", cpu, torch.bfloat16, weight_bytes=big, compiled=True) == "onednn"
    assert resolve_cpu_linear("auto", cpu, torch.bfloat16, weight_bytes=2**20, compiled=True) == "torch"
    assert resolve_cpu_linear("onednn", cpu, torch.float32, weight_bytes=2**20, compiled=True) == "onednn"


def test_openblas_without_openblas_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_linear, "numpy_blas", lambda: "mkl")
    with pytest.raises(ValueError, match="numpy's BLAS is mkl"):
        resolve_cpu_linear("openblas", torch.device("cpu"), torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES)
    cpu = torch.device("cpu")
    assert resolve_cpu_linear("auto", cpu, torch.float32, weight_bytes=AUTO_MIN_WEIGHT_BYTES) == "torch"


def test_cpu_vendor_reads_proc_cpuinfo(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    assert cpu_vendor(info) == "AuthenticAMD"
    assert cpu_vendor(tmp_path / "missing") == ""


def test_apply_gives_the_threads_to_blas_and_one_to_torch() -> None:
    model = tiny_llama()
    assert apply_cpu_linear(model, "openblas", 2) == 2 * 7 + 1
    assert torch.get_num_threads() == 1
    assert [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"][0] == 2
    torch.set_num_threads(3)
    assert apply_cpu_linear(tiny_llama(), "torch", None) == 0
    assert apply_cpu_linear(tiny_llama(), "auto", None) == 0  # 0.2 MB of weights: stays on torch
    assert torch.get_num_threads() == 3  # not routed: torch's threads are left alone


def test_the_manifest_setting_decides_the_engines_kernel() -> None:
    from servegate.contracts.manifest import ServedModel
    from servegate.runtime.engine.reference import ReferenceEngine
    from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

    prompts = ["12+30=", "recall: apple kiwi plum; 2nd?", '{"name": "ada", "age":']
    outputs, routed = {}, {}
    for choice in ("torch", "openblas", "onednn"):
        served = ServedModel.model_validate(
            {"name": "t", "weights": {"source": "zoo:tiny-primary"}, "runtime": {"threads": 1, "cpu_linear": choice}}
        )
        engine = ReferenceEngine(served)
        try:
            reqs = [
                GenerationRequest(str(i), prompt=p, params=SamplingParams(max_tokens=8, temperature=0))
                for i, p in enumerate(prompts)
            ]
            results = engine.generate(reqs)
            model = engine.parts.runner.model
        finally:
            engine.shutdown_sync()
        assert all(isinstance(r, FinishEvent) for r in results)
        outputs[choice] = [r.text for r in results]
        routed[choice] = sum(
            any(hasattr(m, name) for name in ("_servegate_blas", "_servegate_onednn", "_servegate_fused"))
            for m in model.modules()
        )
    assert outputs["openblas"] == outputs["torch"] == outputs["onednn"]
    assert routed == {"torch": 0, "openblas": 2 * 7 + 1, "onednn": 2 * 7 + 1}


def test_an_unknown_kernel_is_refused_by_the_manifest() -> None:
    from pydantic import ValidationError

    from servegate.contracts.manifest import ServedModel

    with pytest.raises(ValidationError, match="cpu_linear"):
        ServedModel.model_validate(
            {"name": "t", "weights": {"source": "zoo:tiny-primary"}, "runtime": {"cpu_linear": "mkl"}}
        )
