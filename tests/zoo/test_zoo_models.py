"""The trained zoo models load with plain transformers and reach their datasheet's numbers."""

from __future__ import annotations

import json

import jsonschema
import pytest
from transformers import AutoConfig
from zoo_helpers import load_causal, recorded_metrics

from servegate.zoo import json_output_schema, load_suite, zoo_model_path
from servegate.zoo.datasheet import render_datasheet
from servegate.zoo.scoring import exact_match_rate, greedy_completions

SAMPLE = 100
CAUSAL_SUITES = ("arith", "recall", "json")


def test_loads_with_auto_classes_offline(trained_name: str) -> None:
    model, tokenizer = load_causal(trained_name)
    config = AutoConfig.from_pretrained(zoo_model_path(trained_name), local_files_only=True)
    assert config.model_type == "llama" and config.max_position_embeddings >= 256
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert tokenizer.padding_side == "left"
    assert tokenizer("773+097=")["input_ids"][0] == tokenizer.bos_token_id
    assert model.generation_config.do_sample is False
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id


def test_files_are_small_safetensors(trained_name: str) -> None:
    path = zoo_model_path(trained_name)
    assert (path / "model.safetensors").stat().st_size <= 8 * 2**20
    assert not list(path.glob("*.bin")) and not list(path.glob("*.pt"))
    for name in ("config.json", "generation_config.json", "tokenizer.json", "DATASHEET.md", "metrics.json"):
        assert (path / name).is_file(), name


def test_both_models_share_one_tokenizer() -> None:
    primary = (zoo_model_path("tiny-primary") / "tokenizer.json").read_bytes()
    assert primary == (zoo_model_path("tiny-fallback") / "tokenizer.json").read_bytes()


def test_datasheet_is_rendered_from_the_recorded_metrics(trained_name: str) -> None:
    datasheet = (zoo_model_path(trained_name) / "DATASHEET.md").read_text(encoding="utf-8")
    assert datasheet == render_datasheet(recorded_metrics(trained_name))


@pytest.mark.parametrize("suite", CAUSAL_SUITES)
def test_greedy_generate_reaches_the_datasheet_numbers(trained_name: str, suite: str) -> None:
    model, tokenizer = load_causal(trained_name)
    items = load_suite(suite, limit=SAMPLE)
    outputs = greedy_completions(model, tokenizer, [item["prompt"] for item in items])
    measured = exact_match_rate(outputs, [item["reference"] for item in items])
    recorded = recorded_metrics(trained_name)["exact_match_first_100"]["none"][suite]
    assert abs(measured - recorded) <= 0.03, (measured, recorded)
    if trained_name == "tiny-primary":
        assert recorded_metrics(trained_name)["exact_match"]["none"][suite] >= 0.95
    else:
        boundary = recorded_metrics(trained_name)["recipe"]["boundary"]
        # the fallback promises only the suites its boundary names
        assert recorded_metrics(trained_name)["exact_match"]["none"][suite] >= boundary.get(suite, 0.0)


def test_completions_end_with_eos_and_json_ones_satisfy_the_schema() -> None:
    model, tokenizer = load_causal("tiny-primary")
    items = load_suite("json", limit=16)
    batch = tokenizer([item["prompt"] for item in items], return_tensors="pt", padding=True)
    out = model.generate(**batch, do_sample=False, max_new_tokens=20)
    validator = jsonschema.Draft202012Validator(json_output_schema())
    for row in out[:, batch["input_ids"].shape[1] :].tolist():
        assert tokenizer.eos_token_id in row
        text = tokenizer.decode(row[: row.index(tokenizer.eos_token_id)])
        assert validator.is_valid(json.loads(text)), text


def test_fallback_is_smaller_and_scores_lower_than_primary() -> None:
    primary, fallback = recorded_metrics("tiny-primary"), recorded_metrics("tiny-fallback")
    assert 1_000_000 <= primary["parameters"] <= 3_000_000
    assert fallback["parameters"] < primary["parameters"]
    assert fallback["recipe"]["steps"] < primary["recipe"]["steps"]
    assert sum(fallback["exact_match"]["none"].values()) < sum(primary["exact_match"]["none"].values())


def test_quantization_variants_were_measured_and_int8_is_near_lossless() -> None:
    exact = recorded_metrics("tiny-primary")["exact_match"]
    assert set(exact) == {"none", "int8-weight", "int4-weight", "fp8-weight", "int2-weight"}
    for suite in CAUSAL_SUITES:
        assert exact["int8-weight"][suite] >= exact["none"][suite] - 0.02
    # 2-bit weights lose more than the quickstart's 3-point margin somewhere: unsafe-quantization.yaml fails.
    drops = {suite: exact["none"][suite] - exact["int2-weight"][suite] for suite in CAUSAL_SUITES}
    assert max(drops.values()) > 0.03, drops
