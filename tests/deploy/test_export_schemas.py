"""Exports are valid for their targets: the vLLM config against vLLM's options (and vLLM's own parser where it
is installed), the Ray Serve and KServe YAML against the field lists their docs publish (fixtures/)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_paths import GOLDEN, HERE, ROOT

from servegate.deploy.vllm_config_check import check_against_known_keys, check_with_vllm, vllm_python

FIXTURES = HERE / "fixtures"


def problems_against(tree: Any, value: Any, where: str = "") -> list[str]:
    """Every key of `value` outside the documented tree, every missing required key, every broken constant."""
    if tree == "*":
        return []
    if isinstance(tree, list):
        if not isinstance(value, list):
            return [f"{where}: a list is expected"]
        return [p for i, item in enumerate(value) for p in problems_against(tree[0], item, f"{where}[{i}]")]
    if "_const" in tree:
        return [] if value == tree["_const"] else [f"{where}: must be {tree['_const']!r} (got {value!r})"]
    if not isinstance(value, dict):
        return [f"{where}: a mapping is expected"]
    out = [f"{where}.{key}: required" for key in tree.get("_required", []) if key not in value]
    exclusive = [key for key in tree.get("_one_of", []) if key in value]
    if len(exclusive) > 1:
        out.append(f"{where}: {' and '.join(exclusive)} exclude each other")
    for key, item in value.items():
        if key.startswith("_") or key not in tree:
            out.append(f"{where}.{key}: not a documented field")
        else:
            out += problems_against(tree[key], item, f"{where}.{key}")
    return out


def _fixture(name: str) -> Any:
    return yaml.safe_load((FIXTURES / name).read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", ["quickstart", "multigpu"])
def test_kserve_export_has_only_documented_fields(case: str) -> None:
    resource = yaml.safe_load((GOLDEN / case / "kserve/llminferenceservice.yaml").read_text())
    assert problems_against(_fixture("kserve_llminferenceservice.yaml"), resource) == []


@pytest.mark.parametrize("case", ["quickstart", "multigpu"])
def test_ray_export_has_only_documented_fields_and_vllm_engine_kwargs(case: str) -> None:
    config = yaml.safe_load((GOLDEN / case / "ray-serve/serve_config.yaml").read_text())
    assert problems_against(_fixture("ray_serve_llm.yaml"), config) == []
    kwargs = config["applications"][0]["args"]["llm_configs"][0]["engine_kwargs"]
    assert check_against_known_keys({k.replace("_", "-"): v for k, v in kwargs.items()}).problems == ()


@pytest.mark.parametrize("case", ["quickstart", "multigpu"])
def test_vllm_config_uses_only_vllm_options(case: str) -> None:
    config = yaml.safe_load((GOLDEN / case / "vllm/config.yaml").read_text())
    result = check_against_known_keys(config)
    assert result.ok, result.problems
    assert result.vllm_version == "0.32.0"


def test_the_fixture_checker_and_known_keys_catch_mistakes() -> None:
    resource = yaml.safe_load((GOLDEN / "multigpu/kserve/llminferenceservice.yaml").read_text())
    resource["spec"]["replicas"] = 2  # with scaling: mutually exclusive
    resource["spec"]["modle"] = {}
    found = problems_against(_fixture("kserve_llminferenceservice.yaml"), resource)
    assert ".spec: replicas and scaling exclude each other" in found and ".spec.modle: not a documented field" in found
    bad = check_against_known_keys({"max-model-lenght": 8, "kv-cache-dtype": "fp9", "enable-prefix-caching": "yes"})
    assert len(bad.problems) == 3 and "max-model-lenght: not an option of vLLM 0.32.0" in bad.problems


@pytest.mark.skipif(vllm_python(ROOT) is None, reason="vLLM is not installed (.venvs/vllm or $SERVEGATE_VLLM_PYTHON)")
@pytest.mark.parametrize("case", ["quickstart", "multigpu"])
def test_vllm_own_parser_accepts_the_export(case: str, tmp_path: Path) -> None:
    python = vllm_python(ROOT)
    assert python is not None
    result = check_with_vllm(GOLDEN / case / "vllm/config.yaml", python)
    assert result.ok, result.problems
    broken = tmp_path / "config.yaml"
    broken.write_text((GOLDEN / case / "vllm/config.yaml").read_text() + "no-such-option: 1\n")
    assert not check_with_vllm(broken, python).ok


@pytest.mark.parametrize("case", ["quickstart", "multigpu"])
def test_kserve_additional_args_are_vllm_options(case: str) -> None:
    import shlex

    resource = yaml.safe_load((GOLDEN / case / "kserve/llminferenceservice.yaml").read_text())
    env = resource["spec"]["template"]["containers"][0]["env"]
    args = shlex.split(next(e["value"] for e in env if e["name"] == "VLLM_ADDITIONAL_ARGS"))
    config: dict[str, Any] = {}
    for arg in args:
        key, _, value = arg.removeprefix("--").partition("=")
        if value:
            config[key] = int(value) if value.isdigit() else value
        elif key.startswith("no-"):
            config[key.removeprefix("no-")] = False
        else:
            config[key] = True
    assert check_against_known_keys(config).problems == ()
    assert "model" not in config and "tensor-parallel-size" not in config  # KServe sets these from spec
