"""Shared pieces of the llama.cpp engines tests: the binary (or a skip with the reason), the GGUF they serve, and the
manifests written against it.

The binary is $SERVEGATE_LLAMACPP_SERVER, else the repo's `.venvs/llamacpp/bin/llama-server` (`make llamacpp`
builds it). The GGUF is the Q8_0 build `make gguf-builds` writes (examples/smollm2/gguf-q8_0.yaml, gated against
its f16 parent), else the zoo's own Q4_1 file (examples/smollm2/gguf.yaml); without either, the tests skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from servegate.runtime.remote.llamacpp_process import LLAMACPP_SERVER_ENV, find_server

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "smollm2"
Q8_0 = EXAMPLES / "gguf-builds" / "q8_0" / "SmolLM2-135M-Instruct-Q8_0.gguf"
"""The Q8_0 build of the f16 GGUF (`make gguf-builds`)."""


def llama_server_binary() -> Path:
    """The llama-server binary, or skip the test with the reason."""
    found = find_server(None, [REPO])
    if found is None:
        named = os.environ.get(LLAMACPP_SERVER_ENV)
        where = f"${LLAMACPP_SERVER_ENV}={named}" if named else f"${LLAMACPP_SERVER_ENV} or {REPO}/.venvs/llamacpp"
        pytest.skip(f"no llama-server at {where}: run `make llamacpp` (or set {LLAMACPP_SERVER_ENV})")
    return found


def gguf_pair() -> tuple[Path, Path]:
    """(the reference manifest of the GGUF, its parent's manifest) the tests serve: the Q8_0 build and its f16
    parent when `make gguf-builds` has run, else the zoo's Q4_1 file and the same file (its own reference)."""
    if Q8_0.is_file() and (EXAMPLES / "gguf-q8_0.yaml").is_file():
        return EXAMPLES / "gguf-q8_0.yaml", EXAMPLES / "gguf-f16.yaml"
    from servegate.zoo import zoo_model_path

    try:
        zoo = zoo_model_path("smollm2-135m-instruct")
    except Exception as exc:  # noqa: BLE001 - any reason the zoo model is missing is a skip
        pytest.skip(f"the zoo's SmolLM2 is not fetched ({exc}): run `gate zoo fetch smollm2-135m-instruct`")
    if not (zoo / "SmolLM2-135M-Instruct.Q4_1.gguf").is_file():
        pytest.skip("the zoo's SmolLM2 GGUF is missing: run `gate zoo fetch smollm2-135m-instruct`")
    return EXAMPLES / "gguf.yaml", EXAMPLES / "gguf.yaml"


def llamacpp_manifest_text(reference: Path, name: str, log_dir: Path, extra_runtime: str = "") -> str:
    """A llamacpp manifest serving `reference`'s GGUF as examples/smollm2/llamacpp.yaml does (4 slots, JSON
    constraints with whitespace), its server log under `log_dir`."""
    return f"""include: {reference}
name: {name}
runtime:
  backend: llamacpp
  device: cpu
  llamacpp: {{log_dir: {log_dir}, startup_timeout_s: 300}}{extra_runtime}
batching: {{mode: continuous, max_batch_size: 4, max_num_batched_tokens: 640}}
postprocess:
  structured_output: {{whitespace: any, kinds: [json_object, json_schema, choice]}}
"""


def process_alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie waiting to be reaped does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
