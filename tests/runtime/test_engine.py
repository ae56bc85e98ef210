"""The reference engine over the toy paged model: every mode, streaming, stats, caches, schema checks."""

from __future__ import annotations

import asyncio

import pytest
from runtime_factories import (
    ToyTokenizer,
    create_sequences,
    reference_outputs,
    token_requests,
    toy_engine,
    toy_generate,
    toy_manifest,
)

from servegate.runtime.engine.interface import Engine
from servegate.runtime.types import ErrorEvent, FinishEvent, GenerationRequest, SamplingParams, TokenEvent

MODES = {
    "none": {"batching": {"mode": "none"}, "runtime": {"kv_cache": None}},
    "static": {"batching": {"mode": "static", "max_wait_ms": 1.0}, "runtime": {"kv_cache": None}},
    "dynamic": {"batching": {"mode": "dynamic", "max_wait_ms": 1.0}, "runtime": {"kv_cache": None}},
    "continuous": {},
    "offline": {"batching": {"mode": "offline"}},
}


def collect(engine: Engine, request: GenerationRequest) -> list[object]:
    async def run() -> list[object]:
        return [event async for event in engine.submit(request)]

    return asyncio.run(run())


@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_returns_the_unbatched_greedy_outputs(mode: str) -> None:
    seqs = create_sequences(32, prompt_lens=(1, 40), max_tokens=(1, 20), seed=11)
    engine = toy_engine(toy_manifest(**MODES[mode]))
    try:
        results = engine.generate(token_requests(seqs))
    finally:
        engine.shutdown_sync()
    expected = reference_outputs(seqs)
    assert [r.request_id for r in results] == [f"r{s.seq_id}" for s in seqs]
    for seq, result in zip(seqs, results, strict=True):
        assert isinstance(result, FinishEvent)
        assert list(result.token_ids) == expected[seq.seq_id]
        assert result.text == ToyTokenizer().decode(expected[seq.seq_id])
        assert result.finish_reason == ("eos" if expected[seq.seq_id][-1] == 2 else "length")
        assert result.usage.prompt_tokens == seq.num_prompt_tokens
        assert result.usage.completion_tokens == len(expected[seq.seq_id])
    stats = engine.stats()
    assert stats.running == 0 and stats.queue_depth == 0 and stats.kv_blocks_used == 0


def test_submit_streams_tokens_then_exactly_one_finish() -> None:
    engine = toy_engine()
    request = GenerationRequest("a", prompt_token_ids=[5, 6, 7], params=SamplingParams(max_tokens=12, ignore_eos=True))
    events = collect(engine, request)
    engine.shutdown_sync()
    *tokens, finish = events
    assert all(isinstance(e, TokenEvent) for e in tokens) and isinstance(finish, FinishEvent)
    assert len(tokens) == 12 and finish.finish_reason == "length"
    assert "".join(e.text for e in tokens) == finish.text
    assert finish.ttft_s is not None and 0 <= finish.ttft_s <= finish.e2e_s


def test_stop_strings_are_trimmed_even_across_tokens_and_never_streamed() -> None:
    tok = ToyTokenizer()
    prompt = [9, 10, 11, 12]
    ids = toy_generate(prompt, 20, eos=None)
    pieces = [tok.piece(i) for i in ids if i not in tok.all_special_ids]
    # a stop string made of the end of one piece and the start of the next one
    boundary = len(pieces[0]) + len(pieces[1]) + len(pieces[2])
    full = "".join(pieces)
    stop = full[boundary - 1 : boundary + 1]
    first = full.find(stop)
    engine = toy_engine()
    request = GenerationRequest(
        "s", prompt_token_ids=prompt, params=SamplingParams(max_tokens=20, stop=(stop,), ignore_eos=True)
    )
    *tokens, finish = collect(engine, request)
    engine.shutdown_sync()
    assert finish.finish_reason == "stop"
    assert finish.text == full[:first]
    assert "".join(e.text for e in tokens) == finish.text


def test_eos_ends_the_output_and_is_not_text() -> None:
    seqs = [s for s in create_sequences(200, max_tokens=(30, 30), seed=5) if 2 in reference_outputs([s])[s.seq_id]]
    engine = toy_engine()
    [result] = engine.generate(token_requests(seqs[:1]))
    engine.shutdown_sync()
    assert result.finish_reason == "eos" and result.token_ids[-1] == 2
    assert result.text == ToyTokenizer().decode(result.token_ids[:-1])


def test_max_tokens_is_capped_by_max_output_tokens() -> None:
    engine = toy_engine(toy_manifest(postprocess={"max_output_tokens": 5}))
    [result] = engine.generate(
        [GenerationRequest("c", prompt_token_ids=[5], params=SamplingParams(max_tokens=50, ignore_eos=True))]
    )
    engine.shutdown_sync()
    assert result.finish_reason == "length" and result.usage.completion_tokens == 5


def test_logprobs_are_returned_only_when_the_manifest_offers_them() -> None:
    params = SamplingParams(max_tokens=4, logprobs=True, ignore_eos=True)
    closed = toy_engine()
    [refused] = closed.generate([GenerationRequest("l", prompt_token_ids=[5, 6], params=params)])
    closed.shutdown_sync()
    assert isinstance(refused, ErrorEvent) and refused.error.code == "invalid_request"
    assert refused.error.param == "logprobs"
    offered = toy_engine(toy_manifest(postprocess={"logprobs": True}))
    [result] = offered.generate([GenerationRequest("l", prompt_token_ids=[5, 6], params=params)])
    offered.shutdown_sync()
    assert len(result.logprobs) == 4 and all(lp <= 0 for lp in result.logprobs)
    assert result.top_logprobs is None
    top = SamplingParams(max_tokens=3, logprobs=True, top_logprobs=2, ignore_eos=True)
    offered = toy_engine(toy_manifest(postprocess={"logprobs": True}))
    [ranked] = offered.generate([GenerationRequest("k", prompt_token_ids=[5, 6], params=top)])
    offered.shutdown_sync()
    tok = ToyTokenizer()
    assert len(ranked.top_logprobs) == 3
    for chosen, logprob, alternatives in zip(ranked.token_ids, ranked.logprobs, ranked.top_logprobs, strict=True):
        assert len(alternatives) == 2 and alternatives[tok.decode([chosen])] == pytest.approx(logprob)  # greedy: top 1


def test_same_seed_same_sample_and_temperature_changes_it() -> None:
    engine = toy_engine()
    req = lambda i, seed: GenerationRequest(  # noqa: E731
        f"t{i}",
        prompt_token_ids=[5, 6, 7],
        params=SamplingParams(max_tokens=16, temperature=2.0, seed=seed, ignore_eos=True),
    )
    a, b, c = engine.generate([req(0, 1), req(1, 1), req(2, 2)])
    engine.shutdown_sync()
    assert a.token_ids == b.token_ids and a.token_ids != c.token_ids


def test_prefix_cache_hits_show_in_stats_and_do_not_change_outputs() -> None:
    served = toy_manifest(runtime={"kv_cache": {"block_size": 4, "memory_budget": "1MiB", "prefix_caching": True}})
    seqs = create_sequences(12, shared_prefix=list(range(10, 30)), seed=2)
    engine = toy_engine(served)
    first = engine.generate(token_requests(seqs[:1]))
    rest = engine.generate(token_requests(seqs[1:]))
    stats = engine.stats()
    engine.shutdown_sync()
    expected = reference_outputs(seqs)
    assert [list(r.token_ids) for r in first + rest] == [expected[s.seq_id] for s in seqs]
    assert stats.prefix_cache_hits >= 11 * 5  # 20 shared tokens = 5 full blocks of 4, for each later request


def test_response_cache_serves_exact_repeats_per_tenant() -> None:
    served = toy_manifest(postprocess={"response_cache": {"enabled": True}})
    engine = toy_engine(served)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    ask = lambda rid, tenant: GenerationRequest(rid, prompt_token_ids=[5, 6], params=params, tenant=tenant)  # noqa: E731
    first, again, other_tenant = (engine.generate([ask(rid, t)])[0] for rid, t in [("1", "a"), ("2", "a"), ("3", "b")])
    events = collect(engine, ask("4", "a"))
    stats = engine.stats()
    engine.shutdown_sync()
    assert not first.cached and again.cached and not other_tenant.cached
    assert again.text == first.text and again.request_id == "2"
    assert isinstance(events[0], TokenEvent) and events[0].text == first.text and events[-1].cached
    assert stats.response_cache_hits == 2


@pytest.mark.parametrize("policy", ["error", "flag"])
def test_output_schema_violations_follow_on_invalid_output(policy: str) -> None:
    served = toy_manifest(
        postprocess={"output_schema": {"type": "object"}}, failure_policy={"on_invalid_output": policy}
    )
    engine = toy_engine(served)
    [result] = engine.generate([GenerationRequest("j", prompt_token_ids=[5], params=SamplingParams(max_tokens=3))])
    engine.shutdown_sync()
    if policy == "error":
        assert isinstance(result, ErrorEvent) and result.error.code == "invalid_output"
        assert result.error.status == 502 and "not JSON" in result.error.message
    else:
        assert isinstance(result, FinishEvent) and result.output_valid is False


def test_bad_requests_get_catalogued_errors() -> None:
    engine = toy_engine()
    bad = [
        GenerationRequest("t", prompt_token_ids=[5], params=SamplingParams(temperature=-1)),
        GenerationRequest("p", prompt_token_ids=[5], params=SamplingParams(top_p=0)),
        GenerationRequest("e", prompt_token_ids=[]),
        GenerationRequest("long", prompt_token_ids=[5] * 128),
    ]
    results = engine.generate(bad)
    engine.shutdown_sync()
    assert [r.error.code for r in results] == [
        "invalid_request",
        "invalid_request",
        "invalid_request",
        "input_too_long",
    ]
    assert [r.error.status for r in results] == [400, 400, 400, 400]


def test_a_generation_engine_serves_no_embeddings_and_vice_versa() -> None:
    from pathlib import Path

    from servegate.contracts.errors import ServingError
    from servegate.contracts.loading import load_manifest
    from servegate.runtime import build

    engine = toy_engine()
    with pytest.raises(ServingError) as refused:
        asyncio.run(engine.embed(["text"]))
    engine.shutdown_sync()
    assert refused.value.code == "invalid_request"

    minilm = build(load_manifest(Path(__file__).parents[2] / "examples/minilm/manifest.yaml"))

    async def use() -> tuple[list[list[float]], list[object]]:
        await minilm.start()
        try:
            vectors = await minilm.embed(["a cat sat", "a dog ran"])
            events = [e async for e in minilm.submit(GenerationRequest("g", prompt="hi"))]
        finally:
            await minilm.shutdown()
        return vectors, events

    vectors, events = asyncio.run(use())
    assert len(vectors) == 2 and len(vectors[0]) == len(vectors[1]) > 0 and vectors[0] != vectors[1]
    assert len(events) == 1 and events[0].error.code == "invalid_request"


def test_the_model_is_loaded_on_the_thread_that_runs_its_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from servegate.runtime.engine import reference as engine_module

    loaded_on: list[str] = []
    real_build = engine_module.build_parts

    def recording_build(*args, **kwargs):
        loaded_on.append(threading.current_thread().name)
        parts = real_build(*args, **kwargs)
        execute = parts.runner.execute

        def recording_execute(chunks):
            stepped_on.add(threading.current_thread().name)
            return execute(chunks)

        parts.runner.execute = recording_execute
        return parts

    stepped_on: set[str] = set()
    monkeypatch.setattr(engine_module, "build_parts", recording_build)
    engine = toy_engine()
    try:
        [seq] = create_sequences(1, prompt_lens=(3, 3), max_tokens=(4, 4), seed=2)
        assert isinstance(collect(engine, token_requests([seq])[0])[-1], FinishEvent)
    finally:
        engine.shutdown_sync()
    # one thread does all the torch work: a second OpenMP pool would slow every step (ReferenceEngine.start_sync)
    assert loaded_on == ["servegate-engine"] and stepped_on == {"servegate-engine"}


def test_a_model_that_fails_to_load_fails_start_with_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from servegate.contracts.errors import ServegateError
    from servegate.runtime.engine import reference as engine_module

    def failing_build(*args, **kwargs):
        raise ServegateError("weights.sha256 mismatch for model.safetensors")

    monkeypatch.setattr(engine_module, "build_parts", failing_build)
    engine = engine_module.ReferenceEngine(toy_manifest())
    with pytest.raises(ServegateError, match="sha256 mismatch"):
        engine.start_sync()
    assert engine.parts is None and engine._thread is None
    # the engine refuses work instead of hanging
    [event] = collect(engine, GenerationRequest("after", prompt_token_ids=[3, 4], params=SamplingParams(max_tokens=2)))
    assert isinstance(event, ErrorEvent)


def test_the_reference_engine_answers_what_callers_ask_without_being_probed() -> None:
    """Tokenizer, token counts, remote, identity and scoring are declared members (a toy runner has no model)."""
    from servegate.runtime.engine.reference import ReferenceEngine

    assert ReferenceEngine(toy_manifest()).why_no_tokenizer == "the engine has not started"
    engine = toy_engine()
    try:
        assert isinstance(engine, Engine) and not engine.remote and engine.identity is None
        assert isinstance(engine.tokenizer, ToyTokenizer) and engine.why_no_tokenizer is None
        assert engine.count_tokens("abc") == 3  # the toy preprocessor: one id per letter
        [scored] = engine.score([GenerationRequest("s", prompt="abc")])
        assert isinstance(scored, ErrorEvent) and "no causal model" in scored.error.message
    finally:
        engine.shutdown_sync()
