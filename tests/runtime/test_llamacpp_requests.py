"""What llama-server gets for an admitted request, and its streamed logprobs read back in OpenAI's completions shape."""

from __future__ import annotations

import json

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.runtime.remote.completions_stream import RemoteReply, read_choice
from servegate.runtime.remote.llamacpp_requests import (
    choice_grammar,
    llama_body,
    openai_choice,
    openai_line,
    unsupported,
)
from servegate.runtime.types import SamplingParams

BASE = {
    "model": "m",
    "prompt": [1, 2, 3],
    "stream": True,
    "max_tokens": 8,
    "temperature": 0.0,
    "top_p": 1.0,
    "seed": 0,
    "structured_outputs": {"json": {}},
    "repetition_penalty": 1.3,
}
"""A body as completions_body builds it (vLLM's spelling where it has one)."""


def test_every_sampling_field_is_sent_so_llamacpp_defaults_never_apply() -> None:
    body = llama_body(dict(BASE), SamplingParams(max_tokens=8), prefix_caching=False, context=640)
    # greedy is greedy: no repeat penalty 1.1, no top-k 40 or min-p 0.05 of llama.cpp's own
    assert (body["repeat_penalty"], body["top_k"], body["min_p"], body["top_p"]) == (1.0, 0, 0.0, 1.0)
    assert body["cache_prompt"] is False and body["logprobs"] == 1  # one logprob names each token's id
    assert "structured_outputs" not in body and "repetition_penalty" not in body
    shaped = llama_body(dict(BASE), SamplingParams(repetition_penalty=1.3, top_logprobs=3), True, 640)
    assert shaped["repeat_penalty"] == 1.3 and shaped["repeat_last_n"] == 640 and shaped["logprobs"] == 3
    assert shaped["cache_prompt"] is True


def test_constraints_become_json_schema_or_a_gbnf_grammar() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    params = SamplingParams(constraint=OutputConstraint("json_schema", json.dumps(schema), "response_format"))
    assert llama_body(dict(BASE), params, False, 640)["json_schema"] == schema
    params = SamplingParams(constraint=OutputConstraint("json_object", "{}", "response_format"))
    assert llama_body(dict(BASE), params, False, 640)["json_schema"] == {"type": "object"}
    choices = SamplingParams(constraint=OutputConstraint("choice", json.dumps(["yes", 'say "no"']), "guided_choice"))
    assert llama_body(dict(BASE), choices, False, 640)["grammar"] == 'root ::= "yes" | "say \\"no\\""'
    assert choice_grammar(["a"]) == 'root ::= "a"'


def test_fields_llamacpp_cannot_honour_are_refused_by_name() -> None:
    assert unsupported(SamplingParams()) is None
    for params, name in [
        (SamplingParams(min_tokens=2), "min_tokens"),
        (SamplingParams(stop_token_ids=(5,)), "stop_token_ids"),
        (SamplingParams(include_stop_str=True), "include_stop_str_in_output"),
        (SamplingParams(constraint=OutputConstraint("regex", "[0-9]+", "guided_regex")), "guided_regex"),
    ]:
        error = unsupported(params)
        assert error is not None and error.code == "unsupported_parameter" and error.param == name


LLAMA_CHOICE = {
    "text": " Paris",
    "index": 0,
    "finish_reason": None,
    "logprobs": {
        "content": [
            {
                "id": 7042,
                "token": " Paris",
                "bytes": [32],
                "logprob": -0.25,
                "top_logprobs": [
                    {"id": 7042, "token": " Paris", "logprob": -0.25},
                    {"id": 2910, "token": " Lyon", "logprob": -2.5},
                ],
            },
        ]
    },
}
"""One streamed /v1/completions choice as llama-server 0.3.36 sends it: chat-shaped logprobs."""


def test_chat_shaped_logprobs_are_read_in_the_completions_shape_with_token_ids() -> None:
    shaped = openai_choice(LLAMA_CHOICE)
    assert shaped["token_ids"] == [7042]
    assert shaped["logprobs"] == {
        "tokens": [" Paris"],
        "token_logprobs": [-0.25],
        "top_logprobs": [{" Paris": -0.25, " Lyon": -2.5}],
    }
    reply = RemoteReply()
    event = read_choice("r", shaped, reply)
    assert event is not None and event.token_ids == (7042,) and event.logprobs == (-0.25,)
    assert reply.top_logprobs == [{" Paris": -0.25, " Lyon": -2.5}]
    named = openai_choice(LLAMA_CHOICE, tokens_as_ids=True)["logprobs"]
    assert named["tokens"] == ["token_id:7042"] and set(named["top_logprobs"][0]) == {"token_id:7042", "token_id:2910"}


def test_stream_lines_are_rewritten_and_other_lines_pass() -> None:
    line = "data: " + json.dumps({"choices": [LLAMA_CHOICE]})
    assert json.loads(openai_line(line)[5:])["choices"][0]["token_ids"] == [7042]
    for other in ("data: [DONE]", ": ping", "", 'data: {"usage": {"completion_tokens": 1}}'):
        assert openai_line(other) == other
    plain = {"text": "x", "index": 0, "logprobs": None}
    assert openai_choice(plain) == plain
