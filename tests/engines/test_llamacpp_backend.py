"""`runtime.backend: llamacpp`: servegate starts llama-server on the real chat model's GGUF from the manifest, serves
chat through its contract, matches servegate's runtime on the same dequantized weights, and stops it."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import openai
import pytest
from llamacpp_support import gguf_pair, llama_server_binary, llamacpp_manifest_text, process_alive
from support.manifests import manifest_file

from servegate.capacity.bench.local_server import LocalServer
from servegate.contracts.errors import RemoteUnavailable
from servegate.contracts.loading import load_manifest
from servegate.runtime import build
from servegate.runtime.remote.llamacpp_backend import LlamaCppEngine
from servegate.runtime.types import FinishEvent, GenerationRequest, SamplingParams

pytestmark = pytest.mark.engines

PROMPTS = [
    "What is the capital of France?",
    "Name the largest planet in the solar system.",
    "How many legs does a spider have?",
    "What colour is the sky on a clear day?",
    "Write one sentence about the sea.",
    "What is 7 times 8?",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
    "What is the boiling point of water in Celsius?",
    "Translate 'thank you' into French.",
    "List three primary colours.",
    "What do bees make?",
]
"""Chat questions for the parity report (the chat template wraps each, as a client's request would be)."""


def test_gate_serve_starts_llamacpp_serves_chat_and_stops_it(tmp_path: Path) -> None:
    llama_server_binary()
    reference, _ = gguf_pair()
    name = f"llamacpp-serve-{tmp_path.name}"  # unique: its --alias finds the server among the processes
    served = manifest_file(tmp_path / "llamacpp.yaml", llamacpp_manifest_text(reference, name, tmp_path / "logs"))
    with LocalServer(served, startup_timeout_s=300) as server:
        client = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)
        chat = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=16,
            temperature=0,
            logprobs=True,
            top_logprobs=2,
        )
        answer = chat.choices[0]
        assert answer.message.content and answer.finish_reason in ("stop", "length")
        assert answer.logprobs is not None and answer.logprobs.content  # llama.cpp's logprobs, in OpenAI's shape
        assert len(answer.logprobs.content[0].top_logprobs) == 2
        assert chat.usage is not None and chat.usage.completion_tokens == len(answer.logprobs.content)
        schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        shaped = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}],
            max_tokens=32,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
        )
        assert "city" in json.loads(shaped.choices[0].message.content or "")  # llama.cpp's grammar, checked here
        stopped = client.completions.create(model=name, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0, stop=[","])
        assert "," not in stopped.choices[0].text
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model=name, prompt="Hi", max_tokens=4, extra_body={"min_tokens": 2})
        assert refused.value.body["code"] == "unsupported_parameter"  # type: ignore[index]
        alive = _servers_named(name)
        assert len(alive) == 1, alive
    assert not any(process_alive(pid) for pid in alive), "llama-server still runs after gate serve stopped"


def _servers_named(alias: str) -> list[int]:
    """Pids of the llama-server processes started with `--alias alias`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if args and args[0].endswith(b"llama-server") and alias.encode() in args:
            found.append(int(cmdline.parent.name))
    return found


def test_greedy_parity_with_servegates_runtime_on_the_same_dequantized_weights(tmp_path: Path) -> None:
    """Reported, not asserted equal: llama.cpp quantizes activations in its dot products, the reference computes in
    float32 on the dequantized weights, so near ties can flip. The gate's paired tests decide (test_llamacpp_gate)."""
    llama_server_binary()
    reference_path, _ = gguf_pair()
    reference = load_manifest(reference_path)
    served = manifest_file(
        tmp_path / "llamacpp.yaml", llamacpp_manifest_text(reference_path, "parity", tmp_path / "logs")
    )

    def requests() -> list[GenerationRequest]:
        params = SamplingParams(max_tokens=16, logprobs=True)
        return [
            GenerationRequest(id=f"p{i}", messages=[{"role": "user", "content": p}], params=params)
            for i, p in enumerate(PROMPTS)
        ]

    ours, theirs = build(reference), build(served)
    try:
        ours.start_sync()
        expected = ours.generate(requests())
        theirs.start_sync()
        got = theirs.generate(requests())
    finally:
        ours.shutdown_sync()
        theirs.shutdown_sync()
    exact, divergence, gaps = 0, [], []
    for a, b in zip(expected, got, strict=True):
        assert isinstance(a, FinishEvent) and isinstance(b, FinishEvent), (a, b)
        assert b.token_source == "remote"  # llama-server's own ids, named in its logprobs
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False)) if x != y), None)
        if same is None and len(a.token_ids) == len(b.token_ids):
            exact += 1
        else:
            divergence.append(same if same is not None else min(len(a.token_ids), len(b.token_ids)))
        common = divergence[-1] if divergence and same is not None else len(a.token_ids)
        if a.logprobs and b.logprobs:  # the same tokens scored by both engines, up to the first divergence
            gaps += [abs(x - y) for x, y in zip(a.logprobs[:common], b.logprobs[:common], strict=False)]
    share = exact / len(PROMPTS)
    print(
        f"\nllama.cpp vs servegate on {reference.weights.gguf_file}: {exact}/{len(PROMPTS)} token-exact ({share:.2f}); "
        f"first divergence at tokens {sorted(divergence)}"
        + (f" (median {statistics.median(divergence)})" if divergence else "")
        + (
            f"; |logprob difference| on shared tokens mean {statistics.mean(gaps):.4f}, max {max(gaps):.4f} nats"
            if gaps
            else ""
        )
    )
    assert gaps and max(gaps) < 1.0  # same weights: token scores agree far closer than a different model's would


def test_a_server_that_fails_to_start_names_its_log(tmp_path: Path) -> None:
    llama_server_binary()
    reference, _ = gguf_pair()
    text = llamacpp_manifest_text(reference, "broken", tmp_path / "logs")
    text = text.replace("startup_timeout_s: 300}", "startup_timeout_s: 60, extra_args: [--no-such-flag]}")
    engine = build(manifest_file(tmp_path / "broken.yaml", text))
    assert isinstance(engine, LlamaCppEngine)
    with pytest.raises(RemoteUnavailable) as caught:
        engine.start_sync()
    message = str(caught.value)
    assert "exited with status" in message and "full log: " in message and str(tmp_path / "logs") in message
