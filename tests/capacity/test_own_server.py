"""Benching a manifest's own server: one server for every workload, progress per run, a refused server named."""

from __future__ import annotations

from typing import Any

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.capacity.bench.own_server import RemoteServer, bench_own_server, own_server, resolve_workload
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel


def endpoint_manifest(url: str) -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "remote",
            "weights": {"source": "zoo:tiny-primary"},
            "runtime": {"backend": "endpoint", "endpoint_url": url},
        }
    )


def workload(n: int) -> Workload:
    return Workload.model_validate(
        {
            "input_tokens": {"mean": 8, "max": 8},
            "output_tokens": {"mean": 3, "max": 3},
            "rate_rps": 50,
            "num_requests": n,
        }
    )


class Progress:
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.done = 0

    def start(self, description: str, total: int) -> None:
        self.started.append((description, total))

    def advance(self, steps: int = 1) -> None:
        self.done += steps


def test_every_workload_runs_in_turn_on_the_one_server_started() -> None:
    progress = Progress()
    with SyntheticServer(Delays(ttft_ms=10, itl_ms=2)) as server:
        served = endpoint_manifest(server.url)
        measured = bench_own_server(served, [workload(4), workload(7)], progress=progress, label="verify")
    first, second = (r.as_dict() for r in measured.results)
    assert (first["requests"]["completed"], second["requests"]["completed"]) == (4, 7)
    assert first["target"] == server.url  # the manifest's endpoint, nothing started
    assert progress.started == [("verify", 4), ("verify", 7)] and progress.done == 11
    assert measured.peak_memory_bytes is None  # an endpoint's memory is not measured here


def test_a_server_given_is_entered_and_its_peak_memory_reported() -> None:
    class Launched:
        def __init__(self, inner: Any) -> None:
            self.inner, self.entered, self.left = inner, False, False

        def __enter__(self) -> Launched:
            self.entered, self.url = True, self.inner.url
            return self

        def __exit__(self, *exc: object) -> None:
            self.left = True

        def peak_rss_bytes(self) -> int:
            return 123

    with SyntheticServer(Delays(ttft_ms=5, itl_ms=1)) as server:
        launched = Launched(server)
        measured = bench_own_server(endpoint_manifest("http://127.0.0.1:9/v1"), [workload(3)], server=launched)
    assert launched.entered and launched.left and measured.peak_memory_bytes == 123
    assert measured.results[0].as_dict()["requests"]["completed"] == 3


def test_a_server_that_refuses_is_a_user_error_naming_it() -> None:
    with pytest.raises(ServegateError, match="127.0.0.1:9"):
        bench_own_server(endpoint_manifest("http://127.0.0.1:9/v1"), [workload(2)])


def test_the_own_server_of_an_endpoint_manifest_is_its_endpoint() -> None:
    with own_server(endpoint_manifest("http://10.0.0.5:8000/v1")) as server:
        assert server == RemoteServer("http://10.0.0.5:8000/v1")


def test_rate_and_request_count_override_the_declared_workload() -> None:
    served = endpoint_manifest("http://h/v1").with_changes(capacity={"workload": workload(9).model_dump()})
    resolved = resolve_workload(served, None, rate=3.0, requests=5)
    assert (resolved.rate_rps, resolved.num_requests, resolved.input_tokens.mean) == (3.0, 5, 8)
    with pytest.raises(ServegateError, match="no workload"):
        resolve_workload(None, None)
