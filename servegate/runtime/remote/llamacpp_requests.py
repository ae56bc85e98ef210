"""What llama-server gets for a request servegate admitted, and its answers read back in OpenAI's shape.

Plain functions over plain data, as completions_stream.py is for any endpoint. Three differences from vLLM's
spelling matter:
- sampling: llama.cpp's own defaults (repeat penalty, top-k 40, min-p 0.05) would apply to every field a
  request leaves out, so each one is sent, neutral unless declared; the repetition penalty is `repeat_penalty`
  over the whole sequence (`repeat_last_n`: max_model_len), as vLLM's covers prompt and output;
- constraints: a JSON Schema goes as `json_schema` (llama.cpp makes its own grammar of it), choices as a GBNF
  grammar; llama.cpp has no regex constraint, and servegate's grammar text is not GBNF: both are refused;
- logprobs: llama-server streams them in the chat shape (`logprobs.content[i]` with `id`, `token`, `logprob`,
  `top_logprobs`), which is read back as the completions shape (`tokens`, `token_logprobs`, `top_logprobs`),
  with the token ids it names. servegate always asks for one logprob, so every answer names its token ids.
"""

from __future__ import annotations

import json
from typing import Any

from servegate.contracts.errors import ServingError
from servegate.runtime.types import SamplingParams, token_id_name

_VLLM_ONLY = (
    "structured_outputs",
    "repetition_penalty",
    "return_token_ids",
    "cache_salt",
    "return_tokens_as_token_ids",
    "skip_special_tokens",
    "include_stop_str_in_output",
)


def unsupported(params: SamplingParams) -> ServingError | None:
    """The refusal of a request field llama-server cannot honour, None when it can serve the request."""
    lacking = {
        "min_tokens": params.min_tokens > 0,
        "stop_token_ids": bool(params.stop_token_ids),
        "include_stop_str_in_output": params.include_stop_str,
        "skip_special_tokens": not params.skip_special_tokens,
    }
    constraint = params.constraint
    if constraint is not None and constraint.kind in ("regex", "grammar"):
        lacking[constraint.param] = True
    for name, asked in lacking.items():
        if asked:
            return ServingError(
                "unsupported_parameter", param=name, detail=f"the llama.cpp backend cannot serve {name}"
            )
    return None


def choice_grammar(choices: list[str]) -> str:
    """A GBNF grammar whose only sentences are `choices`."""
    return "root ::= " + " | ".join(json.dumps(c) for c in choices)


def llama_body(body: dict[str, Any], params: SamplingParams, prefix_caching: bool, context: int) -> dict[str, Any]:
    """A completions body as completions_stream.completions_body builds it, respelled for llama-server;
    `context`: runtime.max_model_len (the repetition penalty looks that far back)."""
    out = {k: v for k, v in body.items() if k not in _VLLM_ONLY}
    out.update(
        repeat_penalty=params.repetition_penalty,
        repeat_last_n=context,  # the whole sequence, as vLLM's penalty counts prompt and output tokens
        top_k=params.top_k,
        min_p=params.min_p,
        top_p=params.top_p,
        cache_prompt=prefix_caching,  # off: a slot does not reuse the previous request's prompt
        logprobs=max(1, params.top_logprobs),  # names every token with its id
    )
    constraint = params.constraint
    if constraint is not None:
        if constraint.kind == "json_object":
            out["json_schema"] = {"type": "object"}
        elif constraint.kind == "json_schema":
            out["json_schema"] = json.loads(constraint.spec)
        elif constraint.kind == "choice":
            out["grammar"] = choice_grammar(json.loads(constraint.spec))
    return out


def openai_choice(choice: dict[str, Any], tokens_as_ids: bool = False) -> dict[str, Any]:
    """A streamed choice with llama-server's chat-shaped logprobs rewritten in the completions shape, and the
    token ids it names as `token_ids` (`tokens_as_ids`: tokens named `token_id:<id>`, as vLLM names them)."""
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(content, list):
        return choice
    ids, tokens, values, tops = [], [], [], []
    for entry in content:
        ids.append(int(entry["id"]))
        tokens.append(token_id_name(int(entry["id"])) if tokens_as_ids else str(entry.get("token", "")))
        values.append(float(entry["logprob"]))
        top: dict[str, float] = {}
        for alt in entry.get("top_logprobs") or []:
            name = token_id_name(int(alt["id"])) if tokens_as_ids else str(alt.get("token", ""))
            top.setdefault(name, float(alt["logprob"]))
        tops.append(top)
    shaped = {k: v for k, v in choice.items() if k != "logprobs"}
    shaped["token_ids"] = ids
    shaped["logprobs"] = {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops}
    return shaped


def openai_line(line: str, tokens_as_ids: bool = False) -> str:
    """One server-sent-events line of llama-server's stream with its choices in the completions shape."""
    if not line.startswith("data:"):
        return line
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return line
    try:
        chunk = json.loads(data)
    except json.JSONDecodeError:
        return line
    if not isinstance(chunk, dict) or not isinstance(chunk.get("choices"), list):
        return line
    chunk["choices"] = [openai_choice(c, tokens_as_ids) for c in chunk["choices"]]
    return "data: " + json.dumps(chunk)
