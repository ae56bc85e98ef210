"""The endpoint backend applies the manifest's contract in front of the remote, as the reference engine does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from support.fake_remote import FakeRemote, RemoteBehaviour
from support.manifests import served_model

from servegate.contracts.constraint_fields import OutputConstraint
from servegate.contracts.manifest import ServedModel
from servegate.runtime import build
from servegate.runtime.remote.endpoint import EndpointEngine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams

LONG_PROMPT = "1+2+3+4+5+6+7+8+9+10+11+12+13+14+15+16+17+18+19+20+21+22+23+24+25+26+27+28+29+30="


def endpoint(url: str, **sections: Any) -> ServedModel:
    """An endpoint manifest over zoo:tiny-primary's tokenizer, with sections merged over the defaults."""
    data: dict[str, Any] = {
        "name": "remote",
        "weights": {"source": "zoo:tiny-primary"},
        "runtime": {"backend": "endpoint", "endpoint_url": url, "max_model_len": 256},
        "preprocess": {"max_input_tokens": 96},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
    }
    return served_model(data, **sections)


@contextlib.asynccontextmanager
async def ready_client(app: Any) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the app in this process, once its /ready answers 200."""
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gate") as client:
            for _ in range(200):
                if (await client.get("/ready")).status_code == 200:
                    break
                await asyncio.sleep(0.05)
            yield client


def run(engine: Any, *requests: GenerationRequest) -> list[Any]:
    return engine.generate(list(requests))


def test_an_over_long_prompt_is_rejected_here_and_never_reaches_the_remote() -> None:
    with FakeRemote() as remote:
        served = endpoint(remote.url, preprocess={"max_input_tokens": 16})
        [result] = run(build(served), GenerationRequest("long", prompt=LONG_PROMPT))
    assert isinstance(result, ErrorEvent) and result.error.code == "input_too_long"
    assert remote.bodies == []


def test_truncation_sends_the_remote_exactly_the_kept_tokens_and_reports_the_drop() -> None:
    with FakeRemote() as remote:
        served = endpoint(remote.url, preprocess={"max_input_tokens": 16, "truncation": "left"})
        [result] = run(build(served), GenerationRequest("long", prompt=LONG_PROMPT, params=SamplingParams(4)))
    assert isinstance(result, FinishEvent)
    [body] = remote.bodies
    assert len(body["prompt"]) == 16 and all(isinstance(t, int) for t in body["prompt"])
    assert result.usage.prompt_tokens == 16 and result.usage.truncated_tokens == len(LONG_PROMPT) + 1 - 16


def test_output_cap_stop_strings_and_seed_are_sent_and_applied() -> None:
    with FakeRemote(RemoteBehaviour(answer=lambda ids, n: "12;34")) as remote:
        served = endpoint(remote.url, postprocess={"max_output_tokens": 8, "stop": [";"]}, runtime={"seed": 7})
        [result] = run(build(served), GenerationRequest("r", prompt="1+1=", params=SamplingParams(max_tokens=100)))
    [body] = remote.bodies
    assert body["max_tokens"] == 8 and body["stop"] == [";"] and body["seed"] == 7
    assert isinstance(result, FinishEvent) and result.text == "12" and result.finish_reason == "stop"


def test_logprobs_are_passed_through() -> None:
    with FakeRemote() as remote:
        params = SamplingParams(max_tokens=3, logprobs=True, top_logprobs=1)
        [result] = run(build(endpoint(remote.url)), GenerationRequest("lp", prompt="1+1=", params=params))
    assert isinstance(result, FinishEvent)
    assert result.logprobs == pytest.approx((-0.5, -0.51, -0.52))
    assert result.top_logprobs is not None and len(result.top_logprobs) == 3
    assert remote.bodies[0]["logprobs"] == 1


def test_the_queue_bound_answers_overloaded_with_retry_after() -> None:
    with FakeRemote(RemoteBehaviour(delay_s=0.4)) as remote:
        served = endpoint(
            remote.url,
            batching={"max_batch_size": 1},
            failure_policy={"max_queue": 2, "retry_after_s": 3},
        )
        engine = build(served)
        engine.start_sync()

        async def burst() -> list[Any]:
            async def one(i: int) -> Any:
                events = [
                    e async for e in engine.submit(GenerationRequest(f"b{i}", prompt="1+1=", params=SamplingParams(2)))
                ]
                return events[-1]

            return list(await asyncio.gather(*(one(i) for i in range(6))))

        results = asyncio.run(burst())
    codes = [r.error.code if isinstance(r, ErrorEvent) else "ok" for r in results]
    assert codes.count("ok") == 3 and codes.count("overloaded") == 3  # 1 in flight + 2 queued
    rejected = next(r for r in results if isinstance(r, ErrorEvent))
    assert rejected.error.status == 429 and rejected.error.headers() == {"Retry-After": "3"}
    assert remote.in_flight_max == 1  # batching.max_batch_size bounds what the remote gets at once


def test_the_deadline_counts_the_wait_in_the_queue() -> None:
    with FakeRemote(RemoteBehaviour(delay_s=1.0)) as remote:
        served = endpoint(remote.url, failure_policy={"request_timeout_s": 0.3})
        [result] = run(build(served), GenerationRequest("slow", prompt="1+1="))
    assert isinstance(result, ErrorEvent) and result.error.code == "deadline_exceeded"


def test_the_response_cache_answers_repeats_without_the_remote() -> None:
    with FakeRemote() as remote:
        served = endpoint(remote.url, postprocess={"response_cache": {"enabled": True}})
        engine = build(served)
        first, second = (
            run(engine, GenerationRequest(f"c{i}", prompt="1+1=", params=SamplingParams(3)))[0] for i in range(2)
        )
    assert len(remote.bodies) == 1
    assert isinstance(second, FinishEvent) and second.cached and second.text == first.text


def test_output_schema_is_checked_on_the_remote_answer() -> None:
    schema = {"type": "object", "required": ["a"]}
    with FakeRemote(RemoteBehaviour(answer=lambda ids, n: "not json")) as remote:
        served = endpoint(remote.url, postprocess={"output_schema": schema})
        [result] = run(build(served), GenerationRequest("j", prompt="1+1="))
    assert isinstance(result, ErrorEvent) and result.error.code == "invalid_output"


def test_a_constraint_is_sent_in_vllms_spelling_and_the_remotes_answer_is_checked_against_it() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    constraint = OutputConstraint("json_schema", json.dumps(schema), "guided_json", compact=True)
    asked = GenerationRequest("j", prompt="1+1=", params=SamplingParams(max_tokens=8, constraint=constraint))
    structured = {"postprocess": {"structured_output": {"whitespace": "compact"}}}
    honours = RemoteBehaviour(answer=lambda ids, n: '{"a":1}', finish_reason="stop")
    with FakeRemote(honours) as remote:
        [result] = run(build(endpoint(remote.url, **structured)), asked)
        assert remote.bodies[0]["structured_outputs"] == {"json": schema}
    assert isinstance(result, FinishEvent) and result.text == '{"a":1}' and result.output_valid is True
    ignores = RemoteBehaviour(answer=lambda ids, n: '{"b":1}', finish_reason="stop")
    with FakeRemote(ignores) as remote:
        [dropped] = run(build(endpoint(remote.url, **structured)), asked)
    assert isinstance(dropped, ErrorEvent) and dropped.error.code == "invalid_output"
    assert "'a' is a required property" in dropped.error.message
    choice = OutputConstraint("choice", json.dumps(["yes", "no"]), "guided_choice")
    cut = RemoteBehaviour(answer=lambda ids, n: "ye")  # cut short by max_tokens: not the constraint's to judge
    with FakeRemote(cut) as remote:
        [short] = run(
            build(endpoint(remote.url, **structured)),
            GenerationRequest("c", prompt="1", params=SamplingParams(max_tokens=2, constraint=choice)),
        )
        assert remote.bodies[0]["structured_outputs"] == {"choice": ["yes", "no"]}
    assert isinstance(short, FinishEvent) and short.finish_reason == "length" and short.output_valid is None


def test_a_failing_remote_hands_requests_to_the_declared_fallback(tmp_path: Any) -> None:
    (tmp_path / "fallback.yaml").write_text(
        "name: backup\nweights: {source: zoo:tiny-fallback}\npostprocess: {max_output_tokens: 32}\n"
    )
    with FakeRemote(RemoteBehaviour(status=500)) as remote:
        data = endpoint(remote.url).model_dump(mode="python")
        data["failure_policy"]["fallback"] = {"manifest": str(tmp_path / "fallback.yaml"), "triggers": ["error"]}
        served = ServedModel.model_validate(data)
        [result] = run(build(served), GenerationRequest("f", prompt="1+1=", params=SamplingParams(3)))
    assert isinstance(result, FinishEvent) and result.fallback_used


def test_tenant_scoped_prefix_cache_is_salted_for_vllm_and_the_tenant_never_leaves() -> None:
    with FakeRemote() as remote:
        served = endpoint(remote.url, runtime={"kv_cache": {"prefix_caching": True, "cache_scope": "tenant"}},
                          batching={"mode": "continuous"})  # fmt: skip
        run(
            build(served),
            *(GenerationRequest(f"t{t}", prompt="1+1=", tenant=t, params=SamplingParams(2)) for t in "ab"),
        )
    salts = [b.get("cache_salt") for b in remote.bodies]
    assert None not in salts and len(set(salts)) == 2
    assert all(b.get("user") is None and "a" != b["cache_salt"] for b in remote.bodies)


def test_the_remote_identity_is_read_at_start() -> None:
    with FakeRemote(RemoteBehaviour(version="0.32.0", max_model_len=256)) as remote:
        engine = build(endpoint(remote.url))
        assert isinstance(engine, EndpointEngine)
        engine.start_sync()
    assert engine.identity is not None
    assert (engine.identity.engine, engine.identity.version, engine.identity.max_model_len) == ("vllm", "0.32.0", 256)


def test_gate_serve_in_front_of_an_endpoint_enforces_limits_and_returns_logprobs() -> None:
    from servegate.server import create_app

    async def scenario(url: str) -> tuple[httpx.Response, httpx.Response]:
        app = create_app(endpoint(url, preprocess={"max_input_tokens": 16}))
        async with ready_client(app) as client:
            long = await client.post("/v1/completions", json={"model": "remote", "prompt": LONG_PROMPT})
            lp = await client.post(
                "/v1/completions", json={"model": "remote", "prompt": "1+1=", "max_tokens": 2, "logprobs": 1}
            )
        return long, lp

    with FakeRemote() as remote:
        long, lp = asyncio.run(scenario(remote.url))
    assert long.status_code == 400 and long.json()["error"]["code"] == "input_too_long"
    logprobs = lp.json()["choices"][0]["logprobs"]
    assert logprobs is not None and logprobs["token_logprobs"] == pytest.approx([-0.5, -0.51])


def test_a_request_that_arrives_past_its_deadline_is_not_sent() -> None:
    with FakeRemote() as remote:
        late = GenerationRequest("late", prompt="1+1=", arrival_time=time.monotonic() - 10.0, timeout_s=1.0)
        [result] = run(build(endpoint(remote.url)), late)
    assert isinstance(result, ErrorEvent) and result.error.code == "deadline_exceeded"
    assert remote.bodies == []


def test_tokenize_and_detokenize_answer_behind_the_endpoint_backend() -> None:
    """The manifest's tokenizer is loaded in front of the remote, so /tokenize works there too (was 404)."""
    from servegate.server import create_app

    async def scenario(url: str) -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        app = create_app(endpoint(url))
        async with ready_client(app) as client:
            tokens = await client.post("/tokenize", json={"model": "remote", "prompt": "1+1="})
            ids = tokens.json().get("tokens", [])
            text = await client.post("/detokenize", json={"model": "remote", "tokens": ids})
            info = await client.get("/tokenizer_info")
        return tokens, text, info

    with FakeRemote() as remote:
        tokens, text, info = asyncio.run(scenario(remote.url))
    assert tokens.status_code == 200, tokens.text
    assert tokens.json()["count"] == 5  # BOS + 4 characters, as the reference runtime counts them
    assert text.status_code == 200 and text.json()["prompt"].endswith("1+1=")
    assert info.status_code == 200, info.text


def test_the_endpoint_engine_answers_what_callers_ask_without_being_probed() -> None:
    """Tokenizer (or why not), token counts, remote, identity and enqueue from another thread: declared members."""
    import threading

    with FakeRemote() as remote:
        engine = build(endpoint(remote.url))
        assert engine.remote and engine.scores_prompts
        assert engine.tokenizer is None and engine.why_no_tokenizer == "the engine has not started"
        assert engine.count_tokens("1+1=") is None and engine.identity is None
        engine.start_sync()
        assert engine.tokenizer is not None and engine.why_no_tokenizer is None
        assert engine.count_tokens("1+1=") == 5  # BOS + 4 characters, the ids the remote is sent
        assert engine.identity is not None and engine.identity.engine == "vllm"
        events: list[Any] = []
        done = threading.Event()

        def sink(event: Any) -> None:
            events.append(event)
            if isinstance(event, (FinishEvent, ErrorEvent)):
                done.set()

        engine.enqueue(GenerationRequest("q", prompt="1+1=", params=SamplingParams(2)), sink)
        assert done.wait(30.0)
        engine.shutdown_sync(grace_s=1.0)
    assert isinstance(events[-1], FinishEvent) and events[-1].usage.completion_tokens == 2
