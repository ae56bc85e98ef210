"""The output-length guard: a candidate whose answers got shorter fails its quality comparison even when the
metric holds (MLPerf's generated-length check beside accuracy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.fake_remote import FakeRemote, RemoteBehaviour

from servegate.contracts.errors import ManifestError
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import LengthBand
from servegate.contracts.schema import manifest_json_schema
from servegate.gates.check import run_check
from servegate.gates.quality.output_length import length_reason, output_length
from servegate.gates.suites.evaluation import ItemOutput
from servegate.gates.suites.output_cache import OutputCache


def outputs(*lengths: int, error_at: int | None = None) -> list[ItemOutput]:
    """One output per length (token ids 1..n, text of n characters); `error_at` makes that item an error."""
    return [
        ItemOutput(str(i), None, error="internal") if i == error_at else ItemOutput(str(i), "a" * n, tuple(range(n)))
        for i, n in enumerate(lengths)
    ]


def test_the_guard_passes_inside_the_band_and_fails_outside_with_the_figures() -> None:
    band = LengthBand()
    inside = output_length("arith", outputs(10, 10), outputs(10, 9), band)
    assert (inside.verdict, inside.ratio) == ("pass", 0.95)
    short = output_length("arith", outputs(10, 10), outputs(5, 5), band)
    assert (short.verdict, short.ratio, short.unit) == ("fail", 0.5, "tokens")
    reason = length_reason(short)
    assert "mean generated tokens 5.00 vs baseline 10.00" in reason and "0.9-1.1" in reason
    long = output_length("arith", outputs(10, 10), outputs(12, 12), band)
    assert long.verdict == "fail"


def test_the_guard_averages_the_items_both_sides_answered_and_counts_characters_for_a_remote() -> None:
    guard = output_length("s", outputs(10, 10, 2), outputs(10, 10, 9, error_at=2), LengthBand())
    assert (guard.items, guard.ratio) == (2, 1.0)
    chars = output_length("s", outputs(4), [ItemOutput("0", "abcd", (1, 2))], LengthBand(), tokens=False)
    assert (chars.unit, chars.ratio) == ("characters", 1.0)
    nothing = output_length("s", outputs(0, 0), outputs(0, 0), LengthBand())
    assert (nothing.verdict, nothing.ratio) == ("pass", None)


def test_length_band_is_validated_and_documented_in_the_json_schema(tmp_path: Path) -> None:
    base = {"apiVersion": "servegate/v1", "kind": "ServedModel", "name": "m", "weights": {"source": "zoo:tiny-primary"}}
    for band, words in (({"low": 1.2}, "low"), ({"high": 0.8}, "high"), ({"low": 0}, "low")):
        path = tmp_path / "m.yaml"
        path.write_text(json.dumps({**base, "quality": {"length_band": band}}))
        with pytest.raises(ManifestError, match=f"quality.length_band.{words}"):
            load_manifest(path)
    schema = json.dumps(manifest_json_schema())
    assert "LengthBand" in schema and "mean generated tokens per item" in schema


# --- the planted fault on the reference backend and on a fake endpoint -----------------------------------

SUITES = [
    {"name": "arith", "dataset": "zoo:arith", "limit": 80, "public": True},
    {"name": "recall", "dataset": "zoo:recall", "limit": 80, "public": True},
]


def reference_manifest(max_output_tokens: int) -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "lengths",
            "weights": {"source": "zoo:tiny-primary"},
            "preprocess": {"chat_template": "none", "max_input_tokens": 96},
            "runtime": {"max_model_len": 128},
            "batching": {"mode": "dynamic", "max_batch_size": 8},
            "postprocess": {"max_output_tokens": max_output_tokens},
            "quality": {"suites": SUITES, "margins": {"exact_match": 0.05}},
        }
    )


def quality_of(baseline: ServedModel, candidate: ServedModel, cache: OutputCache) -> Any:
    report = run_check(baseline, candidate, mode="change", cache=cache)  # the diff runs the quality gate
    [gate] = [g for g in report.gates if g.name == "quality"]
    return gate


def test_a_cut_output_cap_that_keeps_exact_match_fails_on_the_reference_backend(tmp_path: Path) -> None:
    """tiny-primary answers arith and recall in 4 characters and then its end-of-sequence token (5 tokens). A cap
    of 4 ends every answer before that token: exact match is unchanged, generated tokens fall to 0.8x."""
    cache = OutputCache(tmp_path / "cache")
    cut = quality_of(reference_manifest(32), reference_manifest(4), cache)
    assert cut.verdict == "fail", cut.reason
    assert "output length changed although the metrics hold" in cut.reason and "ratio 0.800" in cut.reason
    arith = cut.measurements.model_dump(mode="json")["suites"]["arith"]
    assert arith["exact_match"]["verdict"] == "pass"  # the metric alone would have passed it
    assert arith["output_length"]["verdict"] == "fail" and arith["output_length"]["candidate_mean_tokens"] == 4.0
    safe = quality_of(reference_manifest(32), reference_manifest(8), cache)
    assert safe.verdict == "pass", safe.reason
    assert "output length ratio 1.00-1.00 in band" in safe.reason


def endpoint_manifest(url: str, max_output_tokens: int) -> ServedModel:
    data = json.loads(reference_manifest(max_output_tokens).model_dump_json())
    data["runtime"].update(backend="endpoint", endpoint_url=url, endpoint_model="remote")
    return ServedModel.model_validate(data)


def test_a_cut_output_cap_fails_against_a_fake_endpoint_whose_metric_cannot_tell() -> None:
    """The fake remote answers 'x' up to max_tokens (16 per suite item): exact match is 0 on both sides, so only
    the length guard can see that a cap of 8 halves every answer."""
    with FakeRemote(RemoteBehaviour()) as remote:
        base = endpoint_manifest(remote.url, 32)
        cut = quality_of(base, endpoint_manifest(remote.url, 8), OutputCache(enabled=False))
        safe = quality_of(base, endpoint_manifest(remote.url, 16), OutputCache(enabled=False))
    assert cut.verdict == "fail" and "mean generated characters 8.00 vs baseline 16.00" in cut.reason, cut.reason
    assert safe.verdict == "pass", safe.reason
