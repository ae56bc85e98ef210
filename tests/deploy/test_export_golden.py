"""Golden exports: the quickstart and an eight-GPU manifest, for every target, byte for byte.

After an intended change, regenerate with `SERVEGATE_REGEN_GOLDEN=1 pytest tests/deploy/test_export_golden.py`
and review the diff of tests/deploy/golden/ like code. The manifest's fingerprint is stored as `<fingerprint>`:
it changes whenever the manifest schema grows a field, which is not a change of the export.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_paths import GOLDEN, MULTIGPU, QUICKSTART, regenerate_golden

from servegate.contracts.loading import load_manifest
from servegate.deploy.targets import TARGETS, Deployment, export_manifest, write_export

# where each case's deployment finds the weights (a zoo model's own folder differs from machine to machine)
CASES = {
    "quickstart": (
        QUICKSTART,
        {
            "vllm": "/models/tiny-primary",
            "ray-serve": "/models/tiny-primary",
            "kserve": "pvc://models/tiny-primary",
            "llamacpp": "/models/tiny-primary.gguf",
        },
        None,
    ),
    "multigpu": (MULTIGPU, {}, 4),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("target", TARGETS)
def test_export_matches_golden(case: str, target: str, tmp_path: Path) -> None:
    manifest, models, max_replicas = CASES[case]
    plan = export_manifest(
        load_manifest(manifest),
        target,
        Deployment(model=models.get(target), max_replicas=max_replicas),  # type: ignore[arg-type]
    )
    golden = GOLDEN / case / target
    fingerprint = load_manifest(manifest).fingerprint
    if regenerate_golden():
        for old in golden.glob("*"):
            old.unlink()
        golden.mkdir(parents=True, exist_ok=True)
        for name, text in plan.files.items():
            (golden / name).write_text(without_fingerprint(text, fingerprint), encoding="utf-8")
    expected = sorted(p.name for p in golden.glob("*"))
    assert sorted(plan.files) == expected, f"files differ from {golden}"
    for name in expected:
        got = without_fingerprint(plan.files[name], fingerprint)
        assert got == (golden / name).read_text(encoding="utf-8"), f"{case}/{target}/{name} changed"


def without_fingerprint(text: str, fingerprint: str) -> str:
    """`text` with the manifest's fingerprint (whole, or a prefix of 12 or 16 digits) as a placeholder."""
    for length in (64, 16, 12):
        text = text.replace(fingerprint[:length], f"<fingerprint{'' if length == 64 else length}>")
    return text


@pytest.mark.parametrize("target", TARGETS)
def test_export_is_deterministic(target: str, tmp_path: Path) -> None:
    served = load_manifest(MULTIGPU)
    first = write_export(export_manifest(served, target, Deployment(max_replicas=4)), tmp_path / "a")  # type: ignore[arg-type]
    again = write_export(export_manifest(load_manifest(MULTIGPU), target, Deployment(max_replicas=4)), tmp_path / "b")  # type: ignore[arg-type]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in again]


def test_multigpu_export_carries_the_parallelism() -> None:
    import yaml

    served = load_manifest(MULTIGPU)
    vllm = yaml.safe_load(export_manifest(served, "vllm").files["config.yaml"])
    assert vllm["tensor-parallel-size"] == 8 and vllm["pipeline-parallel-size"] == 1
    assert vllm["model"] == "servegate-demo/demo-70b-instruct" and vllm["revision"] == "3f2a9c1"
    kserve = yaml.safe_load(
        export_manifest(served, "kserve", Deployment(max_replicas=4)).files["llminferenceservice.yaml"]
    )
    spec = kserve["spec"]
    assert spec["parallelism"] == {"tensor": 8, "pipeline": 1}
    assert spec["scaling"] == {"minReplicas": 1, "maxReplicas": 4} and "replicas" not in spec
    assert spec["template"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    ray = yaml.safe_load(export_manifest(served, "ray-serve", Deployment(max_replicas=4)).files["serve_config.yaml"])
    llm = ray["applications"][0]["args"]["llm_configs"][0]
    assert llm["engine_kwargs"]["tensor_parallel_size"] == 8
    assert llm["deployment_config"]["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 4,
        "target_ongoing_requests": 256,
    }
