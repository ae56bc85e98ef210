"""torchao quantization on CUDA: the real kernels where torchao has them, not the simulated forms, and the
quantization gate's verdicts on the quickstart served on the GPU.

Which torchao form each method takes on CUDA (servegate/runtime/model/quantization.py):
int8-weight: Int8WeightOnlyConfig (int8 weights, per-channel scales); int8-dynamic: Int8DynamicActivation-
Int8WeightConfig (int8 x int8 products through torch._int_mm); int4-weight in bfloat16: Int4WeightOnlyConfig
in tinygemm's tile layout (torch's _weight_int4pack_mm kernel); fp8-weight: Float8WeightOnlyConfig
(float8 e4m3 weights). int2/int3 have no torchao form and stay simulated everywhere.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_cases import DEVICE, REHEARSAL, IdsOnly, gpu, id_manifest, id_requests, random_llama, run_engine

from servegate.contracts.sections import Quantization
from servegate.runtime.model.quantization import quantize_model

pytestmark = gpu
ROOT = Path(__file__).parents[2]
QUICKSTART = ROOT / "examples/quickstart"

# method -> (the torchao config used on CUDA in bfloat16, the largest bytes-after / bytes-before of the linears)
REAL_FORMS = {
    "int8-weight": ("Int8WeightOnlyConfig", 0.55),
    "int8-dynamic": ("Int8DynamicActivationInt8WeightConfig", 0.55),
    "int4-weight": ("IntxWeightOnlyConfig" if REHEARSAL else "Int4WeightOnlyConfig", 0.62 if REHEARSAL else 0.40),
    "fp8-weight": ("Float8WeightOnlyConfig", 0.55),
}


@pytest.fixture(scope="module")
def bf16_model() -> Any:
    """The random 1.1B Llama in bfloat16 on the GPU (copied before each quantization)."""
    return random_llama(torch.bfloat16)


@pytest.mark.parametrize("method", list(REAL_FORMS))
def test_torchao_quantizes_on_cuda_with_its_real_form_and_the_model_still_serves(bf16_model: Any, method: str) -> None:
    model = copy.deepcopy(bf16_model)
    # 128: tinygemm's favourite group; a rehearsal's small model has 64 input features
    report = quantize_model(model, Quantization(method=method, group_size=32 if REHEARSAL else 128))
    config, most = REAL_FORMS[method]
    assert (report.backend, report.simulated, report.torchao_config) == ("torchao", False, config), report
    assert report.modules_quantized == 7 * model.config.num_hidden_layers
    assert report.weight_bytes_after <= most * report.weight_bytes_before, report
    weight = model.model.layers[0].mlp.down_proj.weight
    assert type(weight.data) is not torch.Tensor and weight.device.type == DEVICE
    if method == "int4-weight" and not REHEARSAL:
        assert type(weight.data).__name__ == "Int4TilePackedTo4dTensor"  # tinygemm's packed int4
    requests = id_requests(6, model.config.vocab_size, seed=8)
    served = id_manifest(runtime={"dtype": "bfloat16", "kv_cache": {"block_size": 16, "memory_budget": "64MiB"}})
    ids = IdsOnly()
    run = run_engine(served, requests, model=model, tokenizer=ids, preprocessor=ids)
    assert all(isinstance(t, int) for out in run.outputs for t in out), run.outputs


def test_int2_stays_simulated_on_cuda(bf16_model: Any) -> None:
    model = copy.deepcopy(bf16_model)
    report = quantize_model(model, Quantization(method="int2-weight", group_size=32))
    assert (report.backend, report.simulated, report.torchao_config) == ("simulated", True, None)


# --- the quantization gate on the quickstart, served on the GPU ---------------------------------------------


def quantization_verdict(tmp_path: Path, manifest: Path, *sets: str) -> dict[str, Any]:
    """The quantization gate's result of `gate check MANIFEST --gate quantization --set runtime.device=...`."""
    report = tmp_path / f"{manifest.stem}-{len(list(tmp_path.iterdir()))}.json"
    overrides = [arg for s in (f"runtime.device={DEVICE}", *sets) for arg in ("--set", s)]
    command = [sys.executable, "-m", "servegate.cli", "check", str(manifest), "--gate", "quantization"]
    # one baseline cache for every gate run of the session: the reference form's outputs are computed once
    env = {**os.environ, "SERVEGATE_CACHE": str(tmp_path.parent / "gate-cache"), "COLUMNS": "200"}
    done = subprocess.run(
        [*command, *overrides, "--json", str(report)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode in (0, 1), done.stderr[-3000:]
    (gate,) = [g for g in json.loads(report.read_text())["gates"] if g["name"] == "quantization"]
    print(f"quantization gate, {manifest.name} {' '.join(sets)}: {gate['verdict']}: {gate['reason']}")
    assert (gate["verdict"] == "fail") == (done.returncode == 1)
    return gate  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    ("manifest", "sets", "verdict"),
    [("manifest.yaml", (), "pass"), ("unsafe-quantization.yaml", (), "fail")],
    ids=["int8-weight", "int2-weight"],
)
def test_the_quantization_gate_on_cuda_gives_the_cpu_verdicts(
    tmp_path: Path, manifest: str, sets: tuple[str, ...], verdict: str
) -> None:
    """The verdicts the gate gives on the CPU hold on the GPU: the quickstart's int8 weights pass (tightest
    json/json_schema_valid, lower bound -0.018 against a margin of 0.02, in three CPU runs on 2026-12-01), its
    simulated int2 variant fails."""
    gate = quantization_verdict(tmp_path, QUICKSTART / manifest, *sets)
    assert gate["verdict"] == verdict, gate["reason"]


@pytest.mark.parametrize(
    "sets",
    [
        ("runtime.quantization.method=int4-weight", "runtime.dtype=bfloat16"),  # tinygemm on CUDA
        ("runtime.quantization.method=fp8-weight",),
        ("runtime.kv_cache.dtype=fp8",),
    ],
    ids=["int4-weight-bf16", "fp8-weight", "fp8-kv"],
)
def test_the_quantization_gate_judges_the_cuda_forms(tmp_path: Path, sets: tuple[str, ...]) -> None:
    """A verdict from the paired comparison on every suite, whichever it is: on the CPU (2026-12-01) these were
    not stable enough to pin: int4 (float32, torchao's generic int4) failed arith's margin (lower bound -0.043
    <= -0.03); fp8 weights passed in one run (json exact_match 0.985 against 0.99) and failed in another
    (0.83); an fp8 KV pool failed arith (-0.050, lower bound -0.111). The GPU run's output records each."""
    gate = quantization_verdict(tmp_path, QUICKSTART / "manifest.yaml", *sets)
    assert gate["verdict"] in ("pass", "fail"), gate["reason"]
    assert not gate["measurements"]["simulated"]
    assert set(gate["measurements"]["suites"]) == {"arith", "recall", "json"}
