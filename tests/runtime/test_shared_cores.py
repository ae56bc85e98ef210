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
        (2, 2, 2, 1),  # the quickstart on a 2-core machine
        (None, None, 16, 1),  # both on torch's default: the primary takes every core
        (8, 4, 16, 4),  # fits beside the primary: as declared
        (8, None, 16, 8),  # the default lowered to the cores left
        (1, 2, 2, 1),
        (4, 1, 4, 1),  # one thread keeps no worker pool: always allowed
        (None, None, 1, None),  # one core: torch's default is already one thread
    ],
)
def test_the_fallback_gets_the_cores_the_primary_leaves(primary, fallback, cores, expected):
    assert fallback_threads(primary, fallback, cores) == expected


def test_the_quickstart_fallback_is_lowered_to_one_thread_on_two_cores(monkeypatch, caplog):
    monkeypatch.setattr(cpu_linear, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # device auto: both engines on CPU
    primary = load_manifest(QUICKSTART, ["runtime.device=cpu"])
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
