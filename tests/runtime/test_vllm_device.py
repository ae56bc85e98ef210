"""`runtime.device: auto` under `runtime.backend: vllm` is mapped for the device the server will really run on.

On a machine without a GPU, auto is CPU, where vLLM's attention takes KV blocks in multiples of 32 only: the
launch must know that before vLLM starts, and `gate validate` must refuse a size that cannot start (exit 2).
An export for another machine still maps auto as declared. torch's view of CUDA is replaced both ways.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from servegate.cli.app import main
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.remote.vllm_args import engine_args
from servegate.runtime.remote.vllm_backend import launch_device, launch_key, vllm_arguments

QUICKSTART = Path(__file__).parents[2] / "examples/quickstart/manifest.yaml"
AS_VLLM = ["--set", "runtime.backend=vllm", "--set", "runtime.quantization.method=none"]
AS_VLLM += ["--set", "runtime.quantization.calibration=null", "--set", "postprocess.response_cache.enabled=false"]


def manifest(block_size: int = 16, dtype: str = "float32") -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "tiny",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "vllm", "device": "auto", "dtype": dtype, "max_model_len": 128,
                        "kv_cache": {"block_size": block_size, "memory_budget": "64MiB", "prefix_caching": False}},
            "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 256},
            "preprocess": {"max_input_tokens": 64},
            "postprocess": {"max_output_tokens": 16},
        }
    )  # fmt: skip


@pytest.fixture(params=[False, True], ids=["cpu-only", "with-gpu"])
def gpu(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Whether torch sees a GPU here (replaced, so both machines are tested on this one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: request.param)
    return bool(request.param)


def test_auto_is_the_device_torch_finds(gpu: bool) -> None:
    assert launch_device(manifest()) == ("cuda" if gpu else "cpu")


def test_auto_on_a_cpu_only_machine_maps_to_a_block_size_vllm_cpu_starts_with(gpu: bool) -> None:
    served = manifest(block_size=16)
    mapped = engine_args(served, "model", device=launch_device(served))
    if gpu:  # a GPU build takes 16 as declared
        assert mapped.args["block-size"] == 16
        assert vllm_arguments(served, "model").args["block-size"] == 16
        return
    assert mapped.args["block-size"] == 32 and mapped.args["block-size"] % 32 == 0
    with pytest.raises(ServegateError) as refused:  # the size differs from the declared one: said before start
        vllm_arguments(served, "model")
    (line,) = str(refused.value).splitlines()
    assert line.startswith("runtime.backend: vllm cannot serve runtime.kv_cache.block_size = 16: ")
    assert "declare runtime.kv_cache.block_size: 32" in line


def test_a_multiple_of_32_starts_on_either_machine(gpu: bool) -> None:
    assert vllm_arguments(manifest(block_size=64), "model").args["block-size"] == 64


def test_dtype_auto_follows_the_resolved_device(gpu: bool) -> None:
    args = vllm_arguments(manifest(block_size=32, dtype="auto"), "model").args
    assert args["dtype"] == ("bfloat16" if gpu else "float32")


def test_an_export_still_maps_auto_as_declared(gpu: bool) -> None:
    mapped = engine_args(manifest(block_size=16), "model")  # for another machine: this one's GPU says nothing
    assert mapped.args["block-size"] == 16
    assert [r.status for r in mapped.residuals if r.field == "runtime.kv_cache.block_size"] == ["residual"]


def test_the_launch_key_is_the_mapping_that_starts(gpu: bool) -> None:
    assert '"block-size": 32' in launch_key(manifest(block_size=32))


def validate(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["gate", "validate", str(QUICKSTART), *AS_VLLM, *args])
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exited:
        main()
    captured = capsys.readouterr()
    return int(exited.value.code or 0), captured.out + captured.err


def test_validate_refuses_the_quickstart_on_vllm_where_it_cannot_start(
    gpu: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate(monkeypatch, capsys)
    if gpu:
        assert code == 0, out
        return
    assert code == 2, out
    errors = [line for line in out.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: runtime.backend: vllm cannot serve runtime.kv_cache.block_size = 16: vLLM's CPU attention takes "
        "blocks in multiples of 32, so vLLM runs with 32 (fewer, larger blocks; prefixes are reused in whole "
        "blocks): declare runtime.kv_cache.block_size: 32 and gate that"
    ]
    assert "valid" not in out


def test_validate_accepts_the_size_that_starts(
    gpu: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = validate(monkeypatch, capsys, "--set", "runtime.kv_cache.block_size=32")
    assert code == 0, out
    assert "does not start" not in out
