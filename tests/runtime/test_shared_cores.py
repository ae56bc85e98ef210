"""A fallback engine in the primary's process gets at most the CPU cores the primary leaves."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from servegate.contracts.loading import load_fallback, load_manifest
from servegate.runtime import build
from servegate.runtime.failure_policy import shared_cores
from servegate.runtime.failure_policy.shared_cores import beside_primary, fallback_threads
from servegate.runtime.model import cpu_linear

QUICKSTART = Path(__file__).resolve().parents[2] / "examples/quickstart/manifest.yaml"


@pytest.mark.parametrize(
    ("primary", "fallback", "cores", "expected"),
    [
        (2, 2, 2, 1),  # two threads each on a 2-core machine
        (None, None, 16, None),  # both on the default, half the cores each: they fit
        (12, None, 16, 4),  # the default lowered to the cores left
        (8, 4, 16, 4),  # fits beside the primary: as declared
        (1, 2, 2, 1),
        (4, 1, 4, 1),  # one thread keeps no worker pool: always allowed
        (None, None, 1, None),  # one core: the default is already one thread
    ],
)
def test_the_fallback_gets_the_cores_the_primary_leaves(primary, fallback, cores, expected):
    assert fallback_threads(primary, fallback, cores, max(1, cores // 2)) == expected


def test_the_default_is_half_the_cores_or_omp_num_threads(monkeypatch):
    """Unset runtime.threads: not torch's every core (a team that large stalls when a neighbour takes one)."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for cores, threads in ((1, 1), (2, 1), (3, 1), (16, 8)):
        monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", cores)
        assert cpu_linear.default_threads() == threads
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert cpu_linear.default_threads() == 3
    cpu_linear.use_torch_threads(None)
    try:
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(cpu_linear.TORCH_DEFAULT_THREADS)


def test_the_quickstart_runs_one_thread_so_a_neighbour_cannot_stall_it():
    primary = load_manifest(QUICKSTART)
    assert primary.runtime.threads == 1 and load_fallback(primary).runtime.threads == 1


def test_a_two_thread_fallback_is_lowered_to_one_thread_on_two_cores(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # device auto: both engines on CPU
    # the quickstart as it was before it moved to one thread: two for the primary and two for its fallback
    two = tmp_path / "fallback.yaml"
    two.write_text((QUICKSTART.parent / "fallback.yaml").read_text().replace("threads: 1", "threads: 2"))
    primary = load_manifest(
        QUICKSTART, ["runtime.device=cpu", "runtime.threads=2", f"failure_policy.fallback.manifest={two}"]
    )
    declared = load_fallback(primary)
    assert declared.runtime.threads == 2 and primary.runtime.threads == 2

    monkeypatch.setattr(shared_cores, "_said", set())
    with caplog.at_level(logging.WARNING, logger="servegate.runtime"):
        beside = beside_primary(primary, declared)
    assert beside.runtime.threads == 1
    assert beside.model_copy(update={"runtime": declared.runtime}) == declared  # nothing else changes
    assert "runs on 1 torch thread(s), not 2" in caplog.text

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="servegate.runtime"):
        build(primary)  # the engine the CLI and the server use builds its fallback the same way
    assert "runs on 1 torch thread(s), not 2" in caplog.text
    assert [r.levelname for r in caplog.records] == ["INFO"]  # said once per process at WARNING, then quietly


def test_a_fallback_on_the_gpu_keeps_its_threads(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    primary = load_manifest(QUICKSTART, ["runtime.device=cpu"])
    declared = load_fallback(primary)  # device: auto, so CUDA here
    assert beside_primary(primary, declared) is declared


def test_a_fallback_that_fits_beside_the_primary_is_left_as_declared(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", 16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    primary = load_manifest(QUICKSTART, ["runtime.device=cpu"])
    declared = load_fallback(primary)
    with caplog.at_level(logging.WARNING, logger="servegate.runtime"):
        assert beside_primary(primary, declared) is declared
    assert caplog.text == ""
