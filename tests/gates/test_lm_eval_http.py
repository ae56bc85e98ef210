"""lm-eval's own `local-completions` against `gate serve` (echo for log-likelihoods), and the endpoint backend:
the same per-sample scores as servegate's in-process lm-eval model on the reference engine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("lm_eval")

from test_lm_eval_suites import write_manifests  # noqa: E402

from servegate.capacity.bench.local_server import free_port  # noqa: E402
from servegate.contracts.loading import load_manifest  # noqa: E402
from servegate.gates.base import CheckResources, GateContext  # noqa: E402
from servegate.gates.lm_eval.tasks import task_manager  # noqa: E402
from servegate.gates.suites.output_cache import OutputCache  # noqa: E402
from servegate.zoo.catalog import zoo_model_path  # noqa: E402
from servegate.zoo.lm_eval_tasks import task_dir  # noqa: E402

LIMIT = 40


@pytest.fixture(scope="module")
def served_over_http(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Path], str]]:
    """The base manifest, and `gate serve` of it on 127.0.0.1 (stopped after the module)."""
    folder = tmp_path_factory.mktemp("lm-eval-http")
    paths = write_manifests(folder, LIMIT)
    port = free_port()
    log = (folder / "serve.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "servegate.cli",
            "serve",
            str(paths["base"]),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SERVEGATE_CACHE": str(folder / "cache")},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, (folder / "serve.log").read_text()[-2000:]
            time.sleep(0.5)
        else:
            raise AssertionError("gate serve did not become ready in 180 s")
        yield paths, url
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


def in_process_scores(manifest: Path) -> dict[str, dict[str, list[float]]]:
    """Per-sample scores of every suite of `manifest` through servegate's lm-eval model on its own engine."""
    served = load_manifest(manifest)
    ctx = GateContext(served, served, resources=CheckResources(cache=OutputCache(enabled=False)))
    try:
        return {d.suite.lm_eval.task: ctx.run_suite(served, d, role="candidate").scores for d in ctx.suites()}
    finally:
        ctx.engines.close()


def test_local_completions_against_gate_serve_scores_what_servegate_scores(served_over_http: Any) -> None:
    from lm_eval import simple_evaluate

    paths, url = served_over_http
    ours = in_process_scores(paths["base"])
    tasks = ["zoo_arith", "zoo_arith_choice"]
    model_args = {
        "model": "lm-eval-base",
        "base_url": url + "/v1/completions",
        "tokenizer_backend": "huggingface",
        "tokenizer": str(zoo_model_path("tiny-primary")),
        "add_bos_token": True,  # the zoo tokenizer's BOS, as servegate encodes a text prompt
        "tokenized_requests": True,
        "num_concurrent": 2,
        "max_retries": 1,
    }
    results = simple_evaluate(
        model="local-completions",
        model_args=model_args,
        tasks=tasks,
        task_manager=task_manager(str(task_dir()), "zoo_arith"),
        limit=LIMIT,
        log_samples=True,
        bootstrap_iters=0,
    )
    for task, metric in (("zoo_arith", "exact_match"), ("zoo_arith_choice", "acc")):
        samples = {s["doc_id"]: s for s in results["samples"][task]}
        theirs = [float(samples[i][metric]) for i in range(LIMIT)]
        assert theirs == ours[task][metric], task
    assert 0.5 < sum(ours["zoo_arith_choice"]["acc"]) / LIMIT  # a real task, not all-zero agreement


def test_the_endpoint_backend_scores_through_echo_as_the_reference_engine(served_over_http: Any) -> None:
    paths, url = served_over_http
    remote = paths["base"].parent / "remote.yaml"
    remote.write_text(
        f"include: base.yaml\nname: lm-eval-remote\nruntime: {{backend: endpoint, endpoint_url: '{url}', "
        "endpoint_model: lm-eval-base}\n",
        encoding="utf-8",
    )
    assert in_process_scores(remote) == in_process_scores(paths["base"])
