"""runtime.parallelism: defaults to one device, refuses 0, changes the fingerprint and triggers the gates."""

from __future__ import annotations

import pytest

from servegate.contracts.diff import diff_report, gates_for_path
from servegate.contracts.errors import ManifestError
from servegate.contracts.loading import load_manifest

MINIMAL = "examples/minimal.yaml"


def test_defaults_are_one_device() -> None:
    par = load_manifest(MINIMAL).runtime.parallelism
    assert (par.tensor_parallel_size, par.pipeline_parallel_size, par.data_parallel_size) == (1, 1, 1)


def test_zero_is_refused_with_the_field_named() -> None:
    with pytest.raises(ManifestError, match="runtime.parallelism.tensor_parallel_size"):
        load_manifest(MINIMAL, ["runtime.parallelism.tensor_parallel_size=0"])


def test_tensor_parallelism_changes_behaviour_and_triggers_quality_and_capacity() -> None:
    one = load_manifest(MINIMAL)
    eight = load_manifest(MINIMAL, ["runtime.parallelism.tensor_parallel_size=8"])
    report = diff_report(one, eight)
    assert report["same_behaviour"] is False
    assert report["gates"] == {
        "quality": ["runtime.parallelism.tensor_parallel_size"],
        "capacity": ["runtime.parallelism.tensor_parallel_size"],
    }
    assert gates_for_path("runtime.parallelism.pipeline_parallel_size") == ("quality", "capacity")
    assert gates_for_path("runtime.parallelism.tensor_parallel_size") == ("quality", "capacity")
    assert gates_for_path("runtime.parallelism.data_parallel_size") == ("capacity",)  # whole copies
