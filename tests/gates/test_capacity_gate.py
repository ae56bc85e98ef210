"""The capacity gate against an endpoint with known delays: it passes targets that hold, fails missed ones."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

import pytest

from servegate.capacity.synthetic_server import Delays, SyntheticServer
from servegate.contracts.manifest import ServedModel
from servegate.gates.base import GateContext
from servegate.gates.registry import GATES


@pytest.fixture
def gate_class() -> Iterator[type]:
    """The capacity gate as registered by `gate check` (imported through the check orchestration)."""
    importlib.import_module("servegate.gates.check")
    entry = GATES.entry("capacity")
    assert entry.obj.__module__ == "servegate.gates.capacity_gate"
    assert "capacity" in entry.metadata["watches"] and entry.metadata["purpose"]
    yield entry.obj


def served(url: str, targets: dict[str, Any] | None) -> ServedModel:
    capacity: dict[str, Any] = {
        "workload": {
            "input_tokens": {"mean": 8, "max": 8},
            "output_tokens": {"mean": 4, "max": 4},
            "rate_rps": 20,
            "num_requests": 12,
        }
    }
    if targets is not None:
        capacity["targets"] = targets
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "endpoint", "endpoint_url": url},
            "capacity": capacity,
        }
    )


def run(gate_class: type, url: str, targets: dict[str, Any] | None):  # noqa: ANN201
    manifest = served(url, targets)
    return gate_class().run(GateContext(manifest, manifest))


def test_targets_that_hold_pass(gate_class: type) -> None:
    with SyntheticServer(Delays(ttft_ms=20, itl_ms=5)) as server:
        result = run(gate_class, server.url, {"e2e_ms": {"p50": 500, "p99": 1000}, "ttft_ms": {"p99": 500}})
    assert result.verdict == "pass", result.reason
    assert "3 target(s) met at 20 requests/s" in result.reason
    assert result.measurements["e2el_ms"]["p50"] >= 35  # 20 ms + 3 x 5 ms, measured
    assert all(t["met"] for t in result.measurements["targets"])


def test_a_missed_latency_target_and_throughput_floor_fail_with_the_numbers(gate_class: type) -> None:
    with SyntheticServer(Delays(ttft_ms=60, itl_ms=5)) as server:
        result = run(gate_class, server.url, {"e2e_ms": {"p99": 30}, "throughput": {"value": 1000}})
    assert result.verdict == "fail"
    assert "e2e_ms.p99 measured" in result.reason and "against 30 ms" in result.reason
    assert "throughput.requests/s" in result.reason
    missed = {t["name"]: t for t in result.measurements["targets"] if not t["met"]}
    assert missed["e2e_ms.p99"]["missed_by"] > 40


def test_no_targets_is_skipped(gate_class: type) -> None:
    result = run(gate_class, "http://127.0.0.1:9/v1", None)
    assert result.verdict == "skipped" and "no capacity.targets" in result.reason
