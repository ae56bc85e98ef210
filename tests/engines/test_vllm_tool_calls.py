"""Tool calls give the same greedy calls on servegate's reference runtime and through servegate in front of vLLM
(the tools rendered here by the chat template, the forced call's constraint sent as vLLM's structured_outputs,
decoded by xgrammar there and by llguidance here, the call read here), on the same fp32 weights; and the openai
client's tool-calling flow works unmodified through `gate serve` in front of vLLM.

A named choice must give the reference's arguments on at least 95% of the items (fp32 near-ties aside), every
call on both sides must parse and satisfy its schema, and the forced call must differ from plain greedy output
on at least 5 items, so that it is seen doing something.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from engines_support import endpoint_manifest, reference_manifest
from support.drifting_remote import serve_app

from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import Suite
from servegate.contracts.requests import parse_request
from servegate.gates.suites.evaluation import load_suite_data
from servegate.runtime import build
from servegate.runtime.remote.vllm_process import VllmServer
from servegate.runtime.request_translator import engine_requests
from servegate.runtime.tool_calls import read_tool_calls
from servegate.runtime.types import FinishEvent
from servegate.server import create_app

pytestmark = pytest.mark.engines

ITEMS = 60
TOOLS_LINES = "\n  structured_output:\n    whitespace: compact\n  tools: {}"
TEMPLATE = (
    "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.content }}{% endfor %}"
)
SUM = {
    "type": "object",
    "properties": {"sum": {"type": "integer"}},
    "required": ["sum"],
    "additionalProperties": False,
}
TOOLS = [{"type": "function", "function": {"name": "answer", "parameters": SUM}}]


def with_template(served: ServedModel, folder: Path) -> ServedModel:
    (folder / "tools.jinja").write_text(TEMPLATE)
    return served.with_changes(
        preprocess={**served.preprocess.model_dump(mode="python"), "chat_template": str(folder / "tools.jinja")}
    )


def calls(served: ServedModel, engine: Any, prompts: list[str], **fields: Any) -> list[tuple[str, str]]:
    """Each prompt's greedy (text, finish reason) under `fields` (tools and tool_choice), every one a result;
    every call that ended parses and satisfies its schema."""
    requests = []
    for i, prompt in enumerate(prompts):
        body = {"model": served.name, "messages": [{"role": "user", "content": prompt}], "max_tokens": 16, **fields}
        requests += engine_requests(served, parse_request(served, "chat", {**body, "temperature": 0}), f"r{i}", None)
    results = engine.generate(requests)
    assert all(isinstance(r, FinishEvent) for r in results), [r for r in results if not isinstance(r, FinishEvent)]
    for request, result in zip(requests, results, strict=True):
        if request.params.tool_use is not None and result.finish_reason == "eos":  # type: ignore[union-attr]
            reading = read_tool_calls(request.params.tool_use, result.text)  # type: ignore[union-attr]
            assert reading.problem is None, (result, reading)
            for call in reading.calls:
                jsonschema.validate(json.loads(call.arguments), SUM)
    return [(r.text, r.finish_reason) for r in results]  # type: ignore[union-attr]


def test_named_calls_agree_between_the_reference_runtime_and_vllm(vllm_server: VllmServer, tmp_path: Path) -> None:
    reference_served = with_template(reference_manifest(tmp_path, postprocess=TOOLS_LINES), tmp_path)
    remote_served = with_template(endpoint_manifest(tmp_path, vllm_server, postprocess=TOOLS_LINES), tmp_path)
    data = load_suite_data(reference_served, Suite(name="arith", dataset="zoo:arith"))
    prompts = [item.prompt for item in data.items[:ITEMS]]
    reference, remote = build(reference_served), build(remote_served)
    named = {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "answer"}}}
    try:
        plain = calls(reference_served, reference, prompts)
        ours = calls(reference_served, reference, prompts, **named)
        theirs = calls(remote_served, remote, prompts, **named)
    finally:
        reference.shutdown_sync()
    changed = sum(a != b for a, b in zip(plain, ours, strict=True))
    agree = sum(a == b for a, b in zip(ours, theirs, strict=True))
    ended = sum(reason == "eos" for _, reason in ours)
    print(f"\nnamed call: changes {changed} of {len(prompts)} answers, {ended} end; vLLM gives the same {agree}")
    assert changed >= 5 and ended >= 5
    first = next(((a, b) for a, b in zip(ours, theirs, strict=True) if a != b), None)
    assert agree >= 0.95 * len(prompts), first


def test_the_openai_tool_flow_works_through_gate_serve_in_front_of_vllm(
    vllm_server: VllmServer, tmp_path: Path
) -> None:
    served = with_template(endpoint_manifest(tmp_path, vllm_server, postprocess=TOOLS_LINES), tmp_path)
    empty = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    with serve_app(create_app(served)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        required = client.chat.completions.create(
            model=served.name,
            messages=[{"role": "user", "content": "1+1="}],
            tools=empty,  # type: ignore[arg-type]
            tool_choice="required",
            parallel_tool_calls=False,
            max_tokens=32,
            temperature=0,
        )
        choice = required.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert [c.function.name for c in choice.message.tool_calls or []] == ["f"]
        named = client.chat.completions.create(
            model=served.name,
            messages=[{"role": "user", "content": "1+1="}],  # greedy, the reference ends this call
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice={"type": "function", "function": {"name": "answer"}},
            max_tokens=16,
            temperature=0,
            stream=True,
        )
        deltas = [t for c in named if c.choices for t in c.choices[0].delta.tool_calls or []]
        [call] = deltas
        jsonschema.validate(json.loads(call.function.arguments or ""), SUM)
