"""Prompt log-probabilities through the endpoint backend: vLLM's echo answer read, a remote without it refused."""

from __future__ import annotations

import pytest
from support.synthetic_server import Delays, SyntheticServer

from servegate.contracts.errors import ServingError
from servegate.contracts.manifest import ServedModel
from servegate.runtime import build
from servegate.runtime.remote.endpoint_scoring import read_echo
from servegate.runtime.types import ErrorEvent, GenerationRequest

# vLLM 0.32's answer to echo: true, logprobs: 1, max_tokens: 1 on "ab" (docs/vllm-facts.md, section echo):
# the prompt's tokens, then the one generated token; prompt_logprobs keyed by token id, the prompt's own first.
VLLM_CHOICE = {
    "text": "ab0",
    "logprobs": {
        "tokens": ["<bos>", "a", "b", "0"],
        "token_logprobs": [None, -19.73, -18.27, -4.77e-07],
        "top_logprobs": [None, {"a": -19.73, "0": -0.354}, {"b": -18.27, "0": -0.2}, {"0": -4.77e-07}],
    },
    "prompt_logprobs": [
        None,
        {"70": {"logprob": -19.73, "rank": 44, "decoded_token": "a"}, "21": {"logprob": -0.354, "rank": 1}},
        {"71": {"logprob": -18.27, "rank": 1, "decoded_token": "b"}},
    ],
}


def test_vllm_echo_answers_are_read_per_prompt_token() -> None:
    logprobs, greedy, top, ranks = read_echo("http://remote/v1", VLLM_CHOICE, 3)
    assert logprobs == [None, -19.73, -18.27]  # the generated token's entry is not the prompt's
    assert greedy == [True, False, True]  # from the ranks: "a" was 44th, "b" first
    assert top == [{}, {70: -19.73, 21: -0.354}, {71: -18.27}]
    assert ranks == [None, 44, 1]  # each prompt token's own rank, as vLLM states it
    no_ranks = {"logprobs": VLLM_CHOICE["logprobs"]}
    assert read_echo("http://remote/v1", no_ranks, 3)[1] == [True, False, False]  # by value: "0" beat both
    assert read_echo("http://remote/v1", no_ranks, 3)[3] == []  # no ranks said: none known


def test_an_answer_without_prompt_logprobs_is_unsupported_parameter() -> None:
    with pytest.raises(ServingError) as caught:
        read_echo("http://remote/v1", {"text": "x", "logprobs": {"token_logprobs": [-1.0]}}, 3)
    assert caught.value.code == "unsupported_parameter" and caught.value.param == "echo"
    assert "http://remote/v1" in caught.value.message and "1 token log-probabilities for 3 prompt tokens" in str(
        caught.value.message
    )


def test_a_remote_that_cannot_echo_says_so_per_request() -> None:
    with SyntheticServer(Delays(ttft_ms=1, itl_ms=0)) as server:
        served = ServedModel.model_validate(
            {
                "name": "remote",
                "weights": {"source": "zoo:tiny-primary"},
                "runtime": {"backend": "endpoint", "endpoint_url": server.url},
            }
        )
        engine = build(served)
        results = engine.score([GenerationRequest("a", prompt="12+34="), GenerationRequest("b", prompt="7")])
    assert [r.request_id for r in results] == ["a", "b"]
    for result in results:
        assert isinstance(result, ErrorEvent) and result.error.code == "unsupported_parameter"
        assert result.error.param == "echo" and "prompt log-probabilities" in result.error.message
