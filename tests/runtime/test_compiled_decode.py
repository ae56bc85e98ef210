"""runtime.compile: decode: compiled decode steps give the model's own greedy tokens; bad setups are refused.

Compiling takes ~20 s per batch size even for the tiny model (inductor builds and autotunes C++ kernels),
so one module-scoped runner compiled for 1 and 2 sequences serves the behaviour tests. Its eager steps go through
oneDNN, routed after the compile as `runtime.cpu_linear: onednn` does: the graphs must keep running.
"""

from __future__ import annotations

import random
import shutil
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from test_model_runner import block_tables, random_prompts, reference_greedy, run_greedy, tiny_causal_lm

from servegate.contracts.errors import ServegateError
from servegate.contracts.sections import Runtime
from servegate.runtime.model import compiled_decode
from servegate.runtime.model.fused_linear import route_linears_onednn
from servegate.runtime.model.model_runner import PagedModelRunner
from servegate.runtime.model.onednn_linear import onednn_available
from servegate.runtime.types import SeqChunk

needs_compiler = pytest.mark.skipif(
    shutil.which("g++") is None and shutil.which("c++") is None, reason="torch inductor needs a C++ compiler"
)


def compiled_runner(num_blocks: int, **compile_args: object) -> Iterator[tuple[torch.nn.Module, PagedModelRunner]]:
    """A tiny float32 Llama's runner compiled as `compile_args` say, on one torch thread, its eager steps routed
    through oneDNN afterwards as the engine builds `runtime.compile` with `cpu_linear: onednn` (engine/parts.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = tiny_causal_lm("llama").float()
    runner = PagedModelRunner(model, num_blocks=num_blocks, block_size=4, **compile_args)  # type: ignore[arg-type]
    if onednn_available():
        assert route_linears_onednn(model) > 0
    yield model, runner
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def compiled() -> Iterator[tuple[torch.nn.Module, PagedModelRunner]]:
    yield from compiled_runner(48, compile_batch_sizes=(1, 2))


@needs_compiler
def test_compiled_steps_give_the_models_own_greedy_tokens(compiled) -> None:
    model, runner = compiled
    rng = random.Random(5)
    prompts = random_prompts(rng, (5, 12, 9))
    expected = [reference_greedy(model, p, 10) for p in prompts]
    tables = block_tables(3, 9, 48, "scattered", rng)
    before, fallbacks = dict(runner.compiled.runs), runner.compiled.fallbacks
    # two sequences decode side by side (compiled for 2), then one alone (compiled for 1); prefills run eagerly
    out = run_greedy(runner, prompts[:2], 10, tables[:2]) + run_greedy(runner, prompts[2:], 10, tables[2:])
    assert out == expected
    assert runner.compiled.runs[2] - before.get(2, 0) >= 5
    assert runner.compiled.runs[1] - before.get(1, 0) >= 5
    assert runner.compiled.fallbacks == fallbacks


@needs_compiler
def test_other_shapes_run_eagerly_and_agree(compiled) -> None:
    model, runner = compiled
    rng = random.Random(6)
    prompts = random_prompts(rng, (4, 7, 3))
    expected = [reference_greedy(model, p, 6) for p in prompts]
    before, fallbacks = dict(runner.compiled.runs), runner.compiled.fallbacks
    # three sequences prefilled in one step, then decoding together: not a compiled size, every step eager
    assert run_greedy(runner, prompts, 6, block_tables(3, 4, 48, "consecutive", rng), join_every=0) == expected
    assert runner.compiled.runs == before and runner.compiled.fallbacks == fallbacks
    if onednn_available():  # the eager model holds no dense linear weight: its products used the packed ones
        routed = [m for m in model.modules() if hasattr(m, "_servegate_onednn")]
        assert routed and all(0 in m.weight.stride() for m in routed)


@needs_compiler
def test_a_step_that_would_recompile_is_left_to_the_eager_path(compiled) -> None:
    _model, runner = compiled
    fallbacks = runner.compiled.fallbacks
    step, inputs = runner._prepare([SeqChunk(0, (5,), 0, (7,))])
    # outside inference mode the graph's guards fail: no compiler while serving, the caller runs it eagerly
    out = runner.compiled.run(step, **inputs)
    assert out is None and runner.compiled.fallbacks == fallbacks + 1


def test_the_attention_op_refuses_to_run_outside_a_step() -> None:
    q = torch.zeros(1, 4, 1, 16)
    k = torch.zeros(1, 2, 1, 16)
    with pytest.raises(RuntimeError, match="outside a compiled paged step"):
        torch.ops.servegate.paged_attention(q, k, k, 0, None, None, None)


def test_unsupported_setups_are_refused_with_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ServegateError, match="implemented for CPU"):
        compiled_decode.check_compile_support(torch.device("cuda"), quantized=False)
    with pytest.raises(ServegateError, match="quantization.method: none"):
        compiled_decode.check_compile_support(torch.device("cpu"), quantized=True)
    monkeypatch.setattr(compiled_decode.shutil, "which", lambda name: None)
    with pytest.raises(ServegateError, match="C\\+\\+ compiler"):
        compiled_decode.check_compile_support(torch.device("cpu"), quantized=False)


def test_a_compiled_size_needs_kv_blocks_to_warm_up_in() -> None:
    with pytest.raises(ValueError, match="only 2 blocks"):
        PagedModelRunner(tiny_causal_lm("llama").float(), num_blocks=2, block_size=4, compile_batch_sizes=(4,))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"compile": "decode", "cpu_linear": "openblas"}, "choose one"),
        ({"compile": "decode", "quantization": {"method": "int8-weight"}}, "does not take quantization"),
        ({"compile": "decode", "backend": "endpoint", "endpoint_url": "http://x:1/v1"}, "reference backend"),
        ({"compile_batch_sizes": [0]}, ">= 1"),
        ({"compile_batch_sizes": [2, 2]}, "twice"),
        ({"compile_batch_sizes": []}, "at least 1"),
        ({"compile": "graph"}, "'off', 'decode' or 'steps'"),
    ],
)
def test_the_manifest_refuses_inconsistent_compile_settings(fields: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Runtime.model_validate(fields)


def test_compile_defaults_to_off_with_batch_one() -> None:
    runtime = Runtime()
    assert runtime.compile == "off" and runtime.compile_batch_sizes == [1]
    assert Runtime.model_validate({"compile": "decode"}).compile_batch_sizes == [1]


def test_runner_without_compile_has_no_graph() -> None:
    runner = PagedModelRunner(tiny_causal_lm("llama").float(), num_blocks=8, block_size=4)
    assert runner.compiled is None
    logits = runner.execute([SeqChunk(0, (3, 4), 0, (0,))])
    assert logits.shape == (1, runner.vocab_size)
