"""The planner on a known latency model: regimes, recommendations, and infeasible targets explained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from capacity_helpers import STEP_MODEL, manifest

from servegate.capacity.memory.plan import COMPILED_GRAPH_WEIGHT_COPIES, manifest_memory
from servegate.capacity.planning.planner import Plan, plan
from servegate.capacity.planning.report import plan_json, write_batching, write_plan
from servegate.contracts.loading import load_manifest

# every request: 32 prompt tokens, 8 output tokens. Served alone it takes
# 2 ms + (5 + 3.2) ms prefill + 7 x 6 ms decode = 52.2 ms (STEP_MODEL)
WORKLOAD = {
    "input_tokens": {"mean": 32, "max": 32},
    "output_tokens": {"mean": 8, "max": 8},
    "num_requests": 100,
}


def run_plan(model_dir: Path, rate: float, targets: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
    served = manifest(model_dir, capacity={"workload": {**WORKLOAD, "rate_rps": rate}, "targets": targets})
    assert served.capacity.workload is not None
    memory = manifest_memory(served)
    result = plan(served, served.capacity.workload, STEP_MODEL, memory, num_requests=100)
    return result, plan_json(result, STEP_MODEL, {}, served.fingerprint)


def test_latency_target_below_single_request_latency_is_explained(model_dir: Path) -> None:
    result, data = run_plan(model_dir, 2.0, {"e2e_ms": {"p99": 20}})
    assert not result.feasible and not data["feasible"]
    [missed] = [t for t in data["targets"] if not t["met"]]
    assert missed["name"] == "e2e_ms.p99" and missed["missed_by"] > 30
    assert missed["missed_by_pct"] == pytest.approx(100 * (missed["predicted"] / 20 - 1))
    [why] = data["why"]
    assert "e2e_ms.p99" in why and "52.2 ms" in why and "no batching policy can meet it" in why


def test_throughput_floor_out_of_reach_names_the_replicas_needed(model_dir: Path) -> None:
    result, data = run_plan(model_dir, 2.0, {"throughput": {"value": 5000, "unit": "requests/s"}})
    assert not result.feasible
    assert result.regime == "throughput-bound"
    [why] = data["why"]
    assert "throughput.requests/s" in why and "replicas would" in why
    cap = result.recommended.capacity_rps
    assert cap is not None and f"{int(-(-5000 // cap))} replicas" in why


def test_light_load_is_latency_bound(model_dir: Path) -> None:
    result, data = run_plan(model_dir, 1.0, {"e2e_ms": {"p50": 100, "p99": 300}})
    assert result.feasible and result.regime == "latency-bound"
    assert "single-request latency decides" in result.regime_reason
    assert data["predicted"]["e2el_ms"]["p50"] < 100
    for key in ("kv_bytes_per_token", "weights_bytes", "max_concurrent_sequences"):
        assert data[key] > 0
    assert data["kv_bytes_per_token"] == 2 * 2 * 2 * 8 * 4  # layers x K,V x kv_heads x head_dim x fp32


def test_heavy_load_is_throughput_bound_and_batches(model_dir: Path) -> None:
    # one at a time sustains ~19 requests/s; 60 requests/s needs batching
    result, data = run_plan(model_dir, 60.0, {"e2e_ms": {"p99": 1000}})
    assert result.regime == "throughput-bound"
    assert result.feasible
    assert data["recommended"]["batching"]["mode"] != "none"
    assert data["recommended"]["batching"]["max_batch_size"] >= 4
    assert data["predicted"]["throughput"]["requests_per_s"] == pytest.approx(60, rel=0.25)
    assert result.binding["name"]


def test_write_keeps_comments_and_other_sections(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "# my manifest\nname: tiny  # the name\n"
        f"weights:\n  source: {model_dir}\n"
        "batching:\n  mode: none  # old choice\n  max_batch_size: 1\n"
        "postprocess:\n  max_output_tokens: 16  # keep me\n"
    )
    write_batching(path, {"mode": "dynamic", "max_batch_size": 16, "max_wait_ms": 2.0})
    text = path.read_text()
    assert "# my manifest" in text and "# the name" in text and "# keep me" in text
    served = load_manifest(path)
    assert (served.batching.mode, served.batching.max_batch_size, served.batching.max_wait_ms) == ("dynamic", 16, 2.0)


def test_a_memory_target_sizes_the_kv_pool(model_dir: Path) -> None:
    result, data = run_plan(model_dir, 2.0, {"memory": "64MiB", "e2e_ms": {"p99": 1000}})
    mem = data["memory"]
    pool = 64 * 2**20 - mem["weights_bytes"] - mem["runtime_overhead_bytes"]
    assert data["recommended"]["kv_cache"]["memory_budget"] == pool
    assert mem["kv_pool_bytes"] == pool and mem["total_bytes"] == 64 * 2**20
    assert data["recommended"]["kv_blocks"] == pool // (16 * 256)
    assert any("KV pool sized to the memory target" in n for n in data["notes"])
    [memory_check] = [t for t in data["targets"] if t["name"] == "memory"]
    assert memory_check["met"]


def test_closed_loop_regime_depends_on_how_many_wait(model_dir: Path) -> None:
    from servegate.capacity.planning.planner import _regime
    from servegate.contracts.capacity_section import Workload

    served = manifest(model_dir)
    one = Workload.model_validate({**WORKLOAD, "arrival": "closed", "concurrency": 1})
    many = Workload.model_validate({**WORKLOAD, "arrival": "closed", "concurrency": 16})
    assert _regime(served, one, STEP_MODEL)[0] == "latency-bound"
    regime, why, service = _regime(served, many, STEP_MODEL)
    assert regime == "throughput-bound" and "15 waiting behind one served alone" in why
    assert service == pytest.approx(0.0522)


def test_write_plan_sets_max_model_len_and_the_kv_pool_keeping_comments(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        f"name: tiny\nweights:\n  source: {model_dir}\n"
        "preprocess: {max_input_tokens: 64}\npostprocess: {max_output_tokens: 32}\n"
        "runtime:\n  max_model_len: 512  # generous\n  kv_cache:\n    block_size: 16\n    memory_budget: 4MiB  # old\n"
        "batching:\n  mode: none\n"
    )
    write_plan(path, {"mode": "continuous", "max_batch_size": 8}, max_model_len=96, kv_memory_budget=8 * 2**20)
    text = path.read_text()
    assert "# generous" in text and "# old" in text
    served = load_manifest(path)
    assert served.runtime.max_model_len == 96 and served.runtime.kv_cache is not None
    assert served.runtime.kv_cache.memory_budget == 8 * 2**20 and served.batching.mode == "continuous"


def test_max_model_len_is_planned_to_the_longest_request_the_contract_accepts(model_dir: Path) -> None:
    result, data = run_plan(model_dir, 1.0, {"e2e_ms": {"p99": 300}})
    served = result.recommended.served
    need = served.preprocess.max_input_tokens + served.postprocess.max_output_tokens
    assert data["recommended"]["max_model_len"] == need


def test_the_fallback_engines_memory_counts_in_the_plan(tmp_path: Path, model_dir: Path) -> None:
    common = (
        f"weights: {{source: {model_dir}}}\n"
        "preprocess: {max_input_tokens: 64}\npostprocess: {max_output_tokens: 32}\n"
        "runtime: {device: cpu, dtype: float32, max_model_len: 128, kv_cache: {block_size: 16, memory_budget: 2MiB}}\n"
    )
    (tmp_path / "fallback.yaml").write_text("name: small\n" + common)
    primary = tmp_path / "primary.yaml"
    primary.write_text(
        "name: big\n" + common + "failure_policy: {fallback: {manifest: fallback.yaml, triggers: [overload]}}\n"
        "capacity:\n  workload: {input_tokens: {mean: 32, max: 32}, output_tokens: {mean: 8, max: 8}, rate_rps: 1}\n"
        "  targets: {memory: 16MiB}\n"
    )
    served = load_manifest(primary)
    fallback = manifest_memory(load_manifest(tmp_path / "fallback.yaml"))
    memory = manifest_memory(served)
    assert fallback.fallback_bytes == 0 and memory.fallback_bytes == fallback.total_bytes > 2 * 2**20
    assert memory.total_bytes == (
        memory.weights_bytes + memory.runtime_overhead_bytes + memory.kv_pool_bytes + fallback.total_bytes
    )
    assert any(line.startswith("fallback engine (same server): ") for line in memory.lines())
    assert served.capacity.workload is not None
    result = plan(served, served.capacity.workload, STEP_MODEL, memory, num_requests=20)
    # the KV pool gets what the 16 MiB leave after both engines, so the total lands on the target
    assert result.memory.total_bytes <= 16 * 2**20 < result.memory.total_bytes + 16 * result.memory.kv_bytes_per_token
    assert result.memory.kv_pool_bytes == 16 * 2**20 - (
        memory.weights_bytes + memory.runtime_overhead_bytes + fallback.total_bytes
    )
    assert any("fallback manifest's engine" in note and "count in the memory total" in note for note in result.notes)


def test_a_compiled_decode_graphs_copy_of_the_linear_weights_counts_in_the_plan(model_dir: Path) -> None:
    runtime = {
        "device": "cpu",
        "dtype": "float32",
        "max_model_len": 128,
        "kv_cache": {"block_size": 16, "memory_budget": "4MiB"},
    }
    plain = manifest_memory(manifest(model_dir, runtime=runtime))
    compiled = manifest_memory(manifest(model_dir, runtime={**runtime, "compile": "decode"}))
    assert plain.compiled_weights_bytes == 0
    # copies of the tiny config's linear and LM-head weights: each a share of the weights (no embeddings)
    assert 0 < compiled.compiled_weights_bytes // COMPILED_GRAPH_WEIGHT_COPIES < compiled.weights_bytes
    assert compiled.total_bytes == plain.total_bytes + compiled.compiled_weights_bytes
    assert any(line.startswith("compiled graphs (frozen weights): ") for line in compiled.lines())
    assert not any(line.startswith("compiled decode graph") for line in plain.lines())
    # the same per compiled batch size, and the eager steps' oneDNN copy beside the dense weights the graphs keep
    three = manifest(model_dir, runtime={**runtime, "compile": "decode", "compile_batch_sizes": [1, 2, 4]})
    assert manifest_memory(three).compiled_weights_bytes == 3 * compiled.compiled_weights_bytes
    routed = {**runtime, "compile": "decode", "compile_batch_sizes": [1, 2, 4], "cpu_linear": "onednn"}
    one_copy = compiled.compiled_weights_bytes // COMPILED_GRAPH_WEIGHT_COPIES
    assert manifest_memory(manifest(model_dir, runtime=routed)).compiled_weights_bytes == (
        3 * compiled.compiled_weights_bytes + one_copy
    )
    # compile: steps is one graph whatever compile_batch_sizes says (it does not read them), plus the same pack
    steps = {**routed, "compile": "steps"}
    assert manifest_memory(manifest(model_dir, runtime=steps)).compiled_weights_bytes == (
        compiled.compiled_weights_bytes + one_copy
    )


def test_compile_steps_counts_the_rotary_table_the_runtime_builds_for_its_pool(model_dir: Path) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from servegate.runtime.model.rotary_table import table_rotary

    runtime = {"device": "cpu", "dtype": "float32", "max_model_len": 128, "kv_cache": {"memory_budget": "4MiB"}}
    plain = manifest_memory(manifest(model_dir, runtime=runtime))
    steps = manifest_memory(manifest(model_dir, runtime={**runtime, "compile": "steps"}))
    assert plain.rotary_table_bytes == 0 and not any(line.startswith("rotary table") for line in plain.lines())
    # the runtime tables one position per slot of its pool (model_runner: num_blocks x block_size)
    positions = steps.num_kv_blocks * steps.block_size
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    assert table_rotary(model, positions, torch.float32, torch.device("cpu")) == 1
    held = sum(buffer.nbytes for name, buffer in model.named_buffers() if ".rotary_emb." in f".{name}")
    assert steps.rotary_table_bytes == held > 0
    assert steps.total_bytes == plain.total_bytes + steps.compiled_weights_bytes + held
    [line] = [line for line in steps.lines() if line.startswith("rotary table (compile: steps): ")]
    assert line.endswith(f" for {positions:,} positions")
    # with a memory target the planner sizes the pool so that pool and table together land on it
    workload = {**WORKLOAD, "rate_rps": 1.0}
    sized = manifest(model_dir, runtime={**runtime, "compile": "steps"},
                     capacity={"workload": workload, "targets": {"memory": "16MiB"}})  # fmt: skip
    assert sized.capacity.workload is not None
    memory = plan(sized, sized.capacity.workload, STEP_MODEL, manifest_memory(sized), num_requests=20).memory
    slots = memory.num_kv_blocks * memory.block_size
    assert memory.kv_pool_bytes > 4 * 2**20 and memory.rotary_table_bytes == slots * held // positions
    assert memory.total_bytes == memory.fixed_bytes + memory.kv_pool_bytes + memory.rotary_table_bytes
    one_block = memory.block_size * (memory.kv_bytes_per_token + memory.rotary_table_bytes_per_token)
    assert memory.total_bytes <= 16 * 2**20 < memory.total_bytes + one_block


def test_auto_counts_the_eager_steps_onednn_copy_where_the_runtime_packs_one() -> None:
    # the rule of resolve_cpu_linear beside compiled graphs: auto packs bfloat16 weights of 64 MiB or more
    from servegate.capacity.memory.plan import compiled_weights_bytes
    from servegate.contracts.sections import AUTO_MIN_WEIGHT_BYTES, Runtime

    big, small = AUTO_MIN_WEIGHT_BYTES, 2**20
    auto = Runtime(compile="decode", compile_batch_sizes=[1, 2])
    graphs = 2 * COMPILED_GRAPH_WEIGHT_COPIES
    assert compiled_weights_bytes(auto, big, "bfloat16") == big * (graphs + 1)
    assert compiled_weights_bytes(auto, small, "bfloat16") == small * graphs
    assert compiled_weights_bytes(auto, big, "float32") == big * graphs  # never OpenBLAS, so no copy
    torch_linears = Runtime(compile="decode", compile_batch_sizes=[1, 2], cpu_linear="torch")
    assert compiled_weights_bytes(torch_linears, big, "bfloat16") == big * graphs
    assert compiled_weights_bytes(Runtime(), big, "bfloat16") == 0


def test_a_llamacpp_plan_tries_only_slots_whose_kv_fits_its_pool() -> None:
    # llama-server allocates max_model_len tokens of KV for every slot up front: more slots than the pool holds
    # would not start, so the planner never recommends them (a paged engine's pool takes any number)
    from types import SimpleNamespace

    from servegate.capacity.planning.planner import _slots_fit
    from servegate.contracts.manifest import ServedModel

    def served(backend: str, slots: int) -> ServedModel:
        weights = {"source": "gguf-builds/q8_0", "format": "gguf"} if backend == "llamacpp" else {"source": "zoo:x"}
        return ServedModel.model_validate({
            "name": "m", "weights": weights,
            "preprocess": {"max_input_tokens": 96}, "postprocess": {"max_output_tokens": 32},
            "runtime": {"backend": backend, "max_model_len": 128, "kv_cache": {"memory_budget": 4 * 128 * 1000}},
            "batching": {"mode": "continuous", "max_batch_size": slots, "max_num_batched_tokens": 128},
        })  # fmt: skip

    memory = SimpleNamespace(kv_bytes_per_token=1000)
    assert _slots_fit(served("llamacpp", 4), memory)  # type: ignore[arg-type]
    assert not _slots_fit(served("llamacpp", 5), memory)  # type: ignore[arg-type]
    assert _slots_fit(served("reference", 64), memory)  # type: ignore[arg-type]
