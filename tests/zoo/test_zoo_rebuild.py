"""Slow: `gate zoo build` retrains each model from its seeded recipe and reproduces its metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from zoo_helpers import TRAINED, recorded_metrics

from servegate.zoo.build import build_model
from servegate.zoo.catalog import read_index, sha256_file


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("name", TRAINED)
def test_rebuild_reproduces_the_recorded_metrics_within_2_points(name: str, tmp_path: Path) -> None:
    result = build_model(name, tmp_path / name, log=lambda line: None, monitor_every=0)
    recorded = recorded_metrics(name)["exact_match"]
    for variant in ("none", "int8-weight"):
        for suite, value in recorded[variant].items():
            rebuilt = result.metrics["exact_match"][variant][suite]
            assert abs(rebuilt - value) <= 0.02, (variant, suite, rebuilt, value)
    # Same torch build, same single thread: usually the very same bytes; report, do not require.
    same = sha256_file(result.path / "model.safetensors") == read_index()[name]["files"]["model.safetensors"]
    print(f"{name}: weights {'identical to' if same else 'differ from'} the shipped ones")
