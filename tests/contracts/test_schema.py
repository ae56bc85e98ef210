"""The exported JSON Schema validates every example and rejects broken manifests."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
from ruamel.yaml import YAML

from servegate.contracts.loading import read_located
from servegate.contracts.schema import manifest_json_schema

# the manifests, not what `make checkpoints` builds under examples/smollm2/checkpoints (llm-compressor's recipes)
EXAMPLES = sorted(p for p in (Path(__file__).parents[2] / "examples").rglob("*.yaml") if "checkpoints" not in p.parts)


def _read(path: Path) -> dict:
    return YAML(typ="safe").load(path.read_text())


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = manifest_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_there_are_examples() -> None:
    assert any(p.name == "manifest.yaml" and p.parent.name == "quickstart" for p in EXAMPLES)
    assert any(p.name == "minimal.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(p.parents[1])) for p in EXAMPLES])
def test_schema_validates_every_example(validator: jsonschema.Draft202012Validator, path: Path) -> None:
    data = _read(path)
    if "include" in data:  # a variant is checked as merged with its base, as the loader reads it
        data = read_located(path).data
    validator.validate(data)


@pytest.mark.parametrize(
    "broken",
    [
        {"name": "x"},  # no weights
        {"name": "x", "weights": {"source": "zoo:a"}, "batching": {"mode": "turbo"}},
        {"name": "x", "weights": {"source": "zoo:a"}, "batching": {"max_batch_size": 0}},
        {"name": "x", "weights": {"source": "zoo:a"}, "batchng": {}},
        {"name": "x", "weights": {"source": "zoo:a"}, "runtime": {"kv_cache": {"memory_budget": "lots"}}},
    ],
)
def test_schema_rejects_broken_manifests(validator: jsonschema.Draft202012Validator, broken: dict) -> None:
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(broken)


def test_byte_sizes_accept_units(validator: jsonschema.Draft202012Validator) -> None:
    for budget in ["2GiB", "512MB", 1048576, "64 KiB"]:
        validator.validate(
            {"name": "x", "weights": {"source": "zoo:a"}, "runtime": {"kv_cache": {"memory_budget": budget}}}
        )


def test_every_field_is_documented() -> None:
    schema = manifest_json_schema()
    missing = [
        f"{model}.{field}"
        for model, body in [("ServedModel", schema), *schema["$defs"].items()]
        for field, spec in body.get("properties", {}).items()
        if not spec.get("description")
    ]
    assert missing == []


def test_a_yaml_1_1_reader_validates_the_quickstart_against_gate_schema(tmp_path: Path) -> None:
    """PyYAML (YAML 1.1, as many editors and CI linters) reads `on`, `yes`, `off` as booleans: no key may be one."""
    import json
    import subprocess
    import sys

    import yaml

    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "schema", "-o", str(tmp_path / "schema.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    schema = json.loads((tmp_path / "schema.json").read_text())
    quickstart = Path(__file__).parents[2] / "examples/quickstart"
    for name in ("manifest.yaml", "fallback.yaml"):
        jsonschema.validate(yaml.safe_load((quickstart / name).read_text()), schema)


def test_a_manifest_still_writing_fallback_on_is_told_to_rename_it(tmp_path: Path) -> None:
    from servegate.contracts.errors import ManifestError
    from servegate.contracts.loading import load_manifest
    from servegate.contracts.manifest import ServedModel

    path = tmp_path / "m.yaml"
    path.write_text("name: m\nweights: {source: zoo:tiny-primary}\n"
                    "failure_policy:\n  fallback: {manifest: fb.yaml, on: [overload]}\n")  # fmt: skip
    with pytest.raises(ManifestError, match="m.yaml:4:3: failure_policy.fallback: `on` is now `triggers`"):
        load_manifest(path, check_fallback=False)
    import yaml

    as_pyyaml_reads_it = yaml.safe_load(path.read_text())  # the key arrives as True
    assert True in as_pyyaml_reads_it["failure_policy"]["fallback"]
    with pytest.raises(ValueError, match="rename failure_policy.fallback.on to failure_policy.fallback.triggers"):
        ServedModel.model_validate(as_pyyaml_reads_it)
