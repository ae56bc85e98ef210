"""guidellm 0.8.1 with its default streaming body against `gate serve`, unmodified.

guidellm always streams with `stream_options: {"include_usage": true, "continuous_usage_stats": true}`; the
second is a vLLM extension servegate lists as harmless, so a deployment declaring
`preprocess.unknown_fields: ignore` serves every request (and names the dropped field in a header).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from clients_harness import MODEL, GateServe, client_bin, manifest

pytestmark = pytest.mark.clients

REQUESTS, PROMPT_TOKENS, OUTPUT_TOKENS = 30, 32, 8


@pytest.fixture(scope="module")
def lenient_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateServe]:
    """`gate serve` over the zoo's tiny-primary with unknown_fields: ignore."""
    from servegate.zoo import ZooError, zoo_model_path

    try:
        zoo_model_path("tiny-primary")
    except ZooError:
        pytest.skip("the zoo's tiny-primary is not built")
    data = manifest("zoo:tiny-primary", preprocess={"unknown_fields": "ignore"})
    server = GateServe(Path(tmp_path_factory.mktemp("gate-serve-lenient")), data)
    server.wait_ready()
    yield server
    assert server.stop() == 0


def test_guidellm_default_stream_is_served_and_counted(lenient_serve: GateServe, tmp_path: Path) -> None:
    from servegate.zoo import zoo_model_path

    guidellm = client_bin("guidellm", "guidellm")
    backend = {
        "kind": "openai_http",
        "target": lenient_serve.base_url,
        "model": MODEL,
        "request_format": "/v1/completions",
    }
    out = tmp_path / "guidellm.json"
    command = [str(guidellm), "run", "--backend", json.dumps(backend)]
    command += ["--data", f"kind=synthetic_text,prompt_tokens={PROMPT_TOKENS},output_tokens={OUTPUT_TOKENS}"]
    command += ["--tokenizer", f"kind=huggingface_auto,model={zoo_model_path('tiny-primary')}"]
    command += ["--profile", "kind=constant,rate=5", "--constraint", f"kind=max_requests,count={REQUESTS}"]
    command += ["--output", f"kind=json,path={out}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    run = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    metrics = json.loads(out.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": REQUESTS, "errored": 0, "incomplete": 0, "total": REQUESTS}
    assert metrics["prompt_token_count"]["successful"]["mean"] == PROMPT_TOKENS  # read from our usage chunk
    assert metrics["output_token_count"]["successful"]["mean"] == OUTPUT_TOKENS
