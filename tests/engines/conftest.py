"""Real-engine fixtures: one vLLM (CPU build) server on zoo:tiny-primary for the whole test session.

The interpreter that has vLLM is $SERVEGATE_VLLM_PYTHON, else the repo's `.venvs/vllm/bin/python`
(`make vllm-venv` builds it); without either, every test here is skipped with that reason. The server
listens on a free 127.0.0.1 port, logs to a file under the session's tmp dir (named in every failure),
counts as ready only after a real greedy completion, and is stopped, whole process group, at the end.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines_support import READY_ANSWER, READY_PROMPT, READY_TIMEOUT_S, SERVED_NAME, launch_for

from servegate.runtime.remote.vllm_process import VLLM_PYTHON_ENV, VllmLaunchError, VllmServer, find_vllm_python
from servegate.zoo import zoo_model_path

REPO_ROOT = Path(__file__).resolve().parents[2]
_LOGS = pytest.StashKey[list[Path]]()


@pytest.fixture(scope="session")
def vllm_python() -> Path:
    """The interpreter that has vLLM, or skip the test with the reason."""
    found = find_vllm_python(REPO_ROOT)
    if found is None:
        named = os.environ.get(VLLM_PYTHON_ENV)
        where = f"${VLLM_PYTHON_ENV}={named}" if named else f"${VLLM_PYTHON_ENV} or {REPO_ROOT}/.venvs/vllm"
        pytest.skip(f"no vLLM interpreter at {where}: run `make vllm-venv` (or set {VLLM_PYTHON_ENV})")
    return found


def remember_log(config: pytest.Config, path: Path) -> None:
    """Name `path` in the report of every failing engines test of this session."""
    config.stash.setdefault(_LOGS, []).append(path)


@pytest.fixture(scope="session")
def vllm_server(
    vllm_python: Path, tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Iterator[VllmServer]:
    """A ready vLLM server on zoo:tiny-primary, shared by the session and stopped at its end."""
    workdir = tmp_path_factory.mktemp("vllm-tiny-primary")
    # compact JSON, as the structured-output manifests declare (vLLM sets it per server); xgrammar, since
    # llguidance does not read this tokenizer's decoder inside vLLM (servegate's mask reads it token by token)
    structured = json.dumps({"backend": "xgrammar", "disable_any_whitespace": True})
    launch = launch_for(
        vllm_python,
        zoo_model_path("tiny-primary"),
        SERVED_NAME,
        workdir,
        extra_args=("--structured-outputs-config", structured),
    )
    server = VllmServer(launch, workdir / "vllm.log")
    remember_log(pytestconfig, server.log_path)
    server.start()
    try:
        try:
            server.wait_ready(READY_PROMPT, max_tokens=8, expect=READY_ANSWER, timeout_s=READY_TIMEOUT_S)
        except VllmLaunchError as exc:
            pytest.fail(f"vLLM on zoo:tiny-primary did not become ready: {exc}", pytrace=False)
        print(f"\nvLLM ready after {server.ready_after_s:.1f} s on {server.launch.base_url} (log: {server.log_path})")
        yield server
    finally:
        server.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On a failing engines test, add the vLLM log paths of this session to its report."""
    outcome = yield
    report = outcome.get_result()
    logs = item.config.stash.get(_LOGS, [])
    if report.failed and logs:
        report.sections.append(("vLLM logs", "\n".join(str(p) for p in logs)))
