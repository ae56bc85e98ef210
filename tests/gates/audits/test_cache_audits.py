"""The caching gate's timing audits find what no counter shows: a hidden response cache, a prefix cache shared
across tenants; their safe twins pass, and timing noise is inconclusive, never a failure."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support.fake_remote import FakeRemote, RemoteBehaviour
from support.long_context import long_context_manifest, save_long_context_llama
from support.servers import start_gate_serve

from servegate.contracts.manifest import ServedModel
from servegate.contracts.quality_section import CacheAudit
from servegate.gates.audits.cache_audit import RepeatSamples, judge_repeats, judge_samples
from servegate.gates.audits.tenant_audit import detectable_shift_sd, judge_tenants, look_points, samples_per_side
from servegate.gates.audits.unseen_prompts import UnseenPrompts
from servegate.gates.check import run_check
from servegate.gates.result import GateResult
from servegate.gates.suites.output_cache import OutputCache
from servegate.runtime.types import Event, FinishEvent, GenerationRequest

# --- the statistics on planted samples -------------------------------------------------------------------


def times(median_s: float, n: int, seed: int, spread: float = 0.1) -> list[float]:
    """n log-normal times around `median_s` (seeded)."""
    rng = random.Random(seed)
    return [median_s * rng.lognormvariate(0, spread) for _ in range(n)]


def test_the_repeat_detector_finds_a_5x_cache_and_no_cache_and_is_inconclusive_in_noise() -> None:
    config = CacheAudit()
    fresh = times(0.02, 24, 1)
    assert judge_repeats(fresh, times(0.004, 24, 2), config, 0.01)[0] == "cache"
    assert judge_repeats(fresh, times(0.02, 24, 3), config, 0.01)[0] == "no_cache"
    noisy = judge_repeats(times(0.02, 8, 4, spread=1.5), times(0.016, 8, 5, spread=1.5), config, 0.01)
    assert noisy[0] == "inconclusive"


def planted(
    repeat_s: float, other_s: float, unseen_s: float, n: int = 16, spread: float = 0.1, unseen_ratio: float = 1.0
) -> RepeatSamples:
    """Samples of one look; `unseen_ratio`: probe answer length / never-seen answer length (1: the same)."""
    unseen = times(unseen_s, n, 13, spread)
    return RepeatSamples(repeat=times(repeat_s, n, 11, spread), other_seed=times(other_s, n, 12, spread),
                         unseen=unseen, unseen_low=[t * min(1, unseen_ratio) for t in unseen],
                         unseen_high=[t * max(1, unseen_ratio) for t in unseen], first_send=unseen[:4])  # fmt: skip


def test_the_judge_tells_a_seed_blind_cache_from_a_seeded_one_from_none_and_from_a_prefix_cache() -> None:
    config = CacheAudit()
    assert judge_samples(planted(0.004, 0.004, 0.02), config, 0.01)[0] == "cache_ignores_seed"
    assert judge_samples(planted(0.004, 0.02, 0.02), config, 0.01)[0] == "cache"
    assert judge_samples(planted(0.02, 0.02, 0.02), config, 0.01)[0] == "no_cache"
    # a prefix cache: repeats 1.2x faster than never-seen prompts, well within the limit: no response cache
    assert judge_samples(planted(0.0167, 0.0167, 0.02), config, 0.01)[0] == "no_cache"
    # significant but below the least speed-up: not a cache, and not shown absent either
    finding, p = judge_samples(
        planted(0.0167, 0.0167, 0.02, spread=0.02), config.model_copy(update={"max_repeat_speedup": 1.1}), 0.01
    )
    assert p["unseen_faster"] < 0.005 and finding == "inconclusive"
    noisy = planted(0.005, 0.005, 0.02, n=8, spread=1.5)
    assert judge_samples(noisy, config, 0.01)[0] == "inconclusive"


def test_a_never_seen_answer_of_another_length_never_makes_a_finding() -> None:
    """Never-seen answers 4x longer than the probe's take 4x as long with no cache at all: that is no cache;
    4x shorter ones answer about as fast as a cache hit: that shows no cache absent. Both are inconclusive."""
    config = CacheAudit()
    assert judge_samples(planted(0.02, 0.02, 0.08, unseen_ratio=0.25), config, 0.01)[0] == "inconclusive"
    assert judge_samples(planted(0.004, 0.004, 0.005, unseen_ratio=4.0), config, 0.01)[0] == "inconclusive"
    assert judge_samples(planted(0.02, 0.02, 0.02, unseen_ratio=0.5), config, 0.01)[0] == "no_cache"


def test_never_seen_prompts_keep_the_probes_length_in_tokens_and_are_all_new() -> None:
    from servegate.runtime.model.weights import load_tokenizer

    tokenizer = load_tokenizer(ServedModel.model_validate({"name": "t", "weights": {"source": "zoo:tiny-primary"}}))
    for made in (UnseenPrompts(tokenizer), UnseenPrompts()):
        rng = random.Random(3)
        for prompt in ("key=OBYP; ith sum you green key=", "12+34=", "x"):
            variants = [made.variant(prompt, rng) for _ in range(12)]
            assert all(made.length(v) == made.length(prompt) for v in variants), variants
            assert len(set(variants)) == 12 and prompt not in variants
            assert all(v.endswith(prompt[-1]) for v in variants) or len(prompt) == 1  # the answer's cue is kept
    assert UnseenPrompts(tokenizer).unit == "tokens" and UnseenPrompts().unit == "characters"


def test_the_tenant_judge_finds_sharing_isolation_and_says_when_the_cache_does_not_show() -> None:
    fresh, hit = times(0.04, 40, 1), times(0.008, 40, 2)
    assert judge_tenants(fresh, times(0.008, 40, 3), hit, 0.01)[0] == "shared"
    assert judge_tenants(fresh, times(0.04, 40, 4), hit, 0.01)[0] == "isolated"
    fresh, cross, own = (times(0.01, 40, seed, spread=0.5) for seed in (5, 6, 7))
    assert judge_tenants(fresh, cross, own, 0.01)[0] == "inconclusive"


def test_the_power_calculation_gives_the_documented_sample_sizes() -> None:
    assert samples_per_side(0.87, 0.01) == 40
    assert detectable_shift_sd(40, 0.01) == pytest.approx(0.868, abs=0.001)
    assert detectable_shift_sd(250, 0.01) == pytest.approx(0.347, abs=0.001)
    # the audits look every 8 rounds: 40 rounds are 5 looks at 0.002 each, where 40 per side detect d = 1.00
    assert look_points(40) == [8, 16, 24, 32, 40] and look_points(12) == [8, 12] and look_points(8) == [8]
    assert detectable_shift_sd(40, 0.01 / 5) == pytest.approx(1.001, abs=0.001)


# --- against a fake endpoint ------------------------------------------------------------------------------

ENDPOINT: dict[str, Any] = {
    "name": "audited",
    "weights": {"source": "zoo:tiny-primary"},
    "preprocess": {"chat_template": "none", "max_input_tokens": 96},
    "runtime": {"max_model_len": 128, "backend": "endpoint", "endpoint_model": "remote"},
    "postprocess": {"max_output_tokens": 16},
    "quality": {
        "suites": [{"name": "arith", "dataset": "zoo:arith", "limit": 8, "max_tokens": 8}],
        "cache_audit": {"repeat_samples": 16, "tenant_samples": 16},
    },
}


def endpoint(url: str, **sections: dict[str, Any]) -> ServedModel:
    data = json.loads(json.dumps(ENDPOINT))
    data["runtime"]["endpoint_url"] = url
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return ServedModel.model_validate(data)


def caching(served: ServedModel, engine_factory: Any = None, cache: OutputCache | None = None) -> GateResult:
    """The caching gate, forced, on `served` against its reference form."""
    report = run_check(served.reference_form(), served, mode="reference", forced=["caching"],
                       engine_factory=engine_factory, cache=cache or OutputCache(enabled=False))  # fmt: skip
    [gate] = [g for g in report.gates if g.name == "caching"]
    return gate


def test_an_endpoint_with_a_hidden_global_response_cache_fails_and_its_twin_passes() -> None:
    with FakeRemote(RemoteBehaviour(delay_s=0.06, hidden_response_cache=True)) as remote:
        hidden = caching(endpoint(remote.url))
    assert hidden.verdict == "fail", hidden.reason
    assert "an undeclared response cache answers exact repeats" in hidden.reason
    found = hidden.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]
    assert found["finding"] == "cache" and found["speedup"] > 1.5 and found["header_hits"] == 0
    with FakeRemote(RemoteBehaviour(delay_s=0.06)) as remote:
        clean = caching(endpoint(remote.url))
    assert clean.verdict == "pass", clean.reason
    assert clean.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]["finding"] == "no_cache"


def test_an_endpoint_whose_response_cache_ignores_the_seed_is_found_not_passed_as_absent() -> None:
    """A gateway cache keyed on the prompt and sampling settings but not the seed answers the other-seed request
    from its cache too: only a never-seen request of the same shape shows what an uncached answer costs."""
    behaviour = RemoteBehaviour(delay_s=0.06, hidden_response_cache=True, response_cache_ignores_seed=True)
    with FakeRemote(behaviour) as remote:
        blind = caching(endpoint(remote.url))
    assert blind.verdict == "fail", blind.reason
    assert "ignores the seed" in blind.reason and "no response cache" not in blind.reason
    found = blind.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]
    assert found["finding"] == "cache_ignores_seed", found["reason"]
    assert found["unseen_median_ms"] > 1.5 * max(found["repeat_median_ms"], found["other_seed_median_ms"])
    assert found["unseen_shape_mismatches"] == 0  # the never-seen prompts had the probes' length in tokens
    distinct = {json.dumps(body["prompt"]) for body in remote.bodies}
    assert len(distinct) >= min(8, found["pairs"]) + found["pairs"]  # 8 probes, then one never-seen prompt a pair


def remote_manifest(response_cache: bool) -> dict[str, Any]:
    """What `gate serve` runs behind the endpoint: the tiny model, one tenant, its own response cache on or off."""
    return {
        "name": "remote",
        "weights": {"source": "zoo:tiny-primary"},
        "preprocess": {"chat_template": "none", "max_input_tokens": 96},
        "runtime": {"max_model_len": 128, "threads": 1},
        "postprocess": {"max_output_tokens": 16, "response_cache": {"enabled": response_cache, "scope": "global"}},
    }


def test_an_endpoint_in_front_of_gate_serve_finds_no_cache_there_and_finds_its_response_cache(tmp_path: Path) -> None:
    """servegate's own response cache keys on the seed: behind an endpoint it is found as a cache keyed on it;
    without it the honest remote is never reported as caching."""
    found: dict[bool, tuple[GateResult, dict[str, Any]]] = {}
    for cached in (False, True):
        (tmp_path / str(cached)).mkdir()
        server = start_gate_serve(tmp_path / str(cached), remote_manifest(cached))
        try:
            server.wait_ready()
            gate = caching(endpoint(server.base_url + "/v1"))
        finally:
            server.stop()
        found[cached] = gate, gate.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]
    honest, timing = found[False]
    assert honest.verdict != "fail" and timing["finding"] in ("no_cache", "inconclusive"), timing["reason"]
    assert timing["ignore_eos"] and timing["unseen_shape_mismatches"] == 0 and timing["unseen_length_mismatches"] == 0
    remote_cache, timing = found[True]
    assert remote_cache.verdict == "fail" and timing["finding"] == "cache", timing["reason"]
    assert "an undeclared response cache answers exact repeats (" in remote_cache.reason
    assert timing["seed_speedup"] > 1.5 and timing["speedup"] > 1.5


TENANTS = {
    "preprocess": {"chat_template": "none", "max_input_tokens": 96, "tenant_from": "header"},
    "runtime": {
        "max_model_len": 128,
        "backend": "endpoint",
        "endpoint_model": "remote",
        "kv_cache": {"block_size": 16, "prefix_caching": True, "cache_scope": "tenant"},
    },
    "batching": {"mode": "continuous"},
    "postprocess": {"max_output_tokens": 16, "response_cache": {"enabled": True, "scope": "tenant"}},
}


def tenant_endpoint(url: str, samples: int = 16) -> ServedModel:
    served = endpoint(url, **TENANTS)
    audit = {"repeat_samples": 16, "tenant_samples": samples}
    return served.with_changes(quality={**served.quality.model_dump(mode="python"), "cache_audit": audit})


def prefix_remote(kind: str) -> FakeRemote:
    """A remote whose first chunk waits 0.5 ms per prompt token its prefix cache (salted or shared) lacks."""
    return FakeRemote(RemoteBehaviour(delay_s=0.003, prefill_s_per_token=0.0005, prefix_cache=kind))  # type: ignore[arg-type]


def test_an_endpoint_prefix_cache_shared_across_tenants_shows_only_in_ttft_and_fails() -> None:
    with prefix_remote("shared") as remote:
        leaky = caching(tenant_endpoint(remote.url, samples=40))
    assert leaky.verdict == "fail", leaky.reason
    # 40 ms of prefill saved against a few of noise: a look decides long before the 40 rounds allowed, each of
    # the 5 looks at 0.01 / 5
    isolation = leaky.measurements.model_dump(mode="json")["timing_audits"]["isolation"]
    assert isolation["samples"] in (8, 16, 24) and isolation["alpha"] == pytest.approx(0.002), isolation
    assert "a prompt cache is shared across tenants" in leaky.reason
    assert leaky.measurements.tenant_b_extra_hits == 0  # the counters saw nothing: only the clock did
    with prefix_remote("salted") as remote:
        salted = caching(tenant_endpoint(remote.url))
    assert salted.verdict == "pass", salted.reason
    assert salted.measurements.model_dump(mode="json")["timing_audits"]["isolation"]["finding"] == "isolated"
    assert all("cache_salt" in body for body in remote.bodies)


def json_remote(kind: str) -> FakeRemote:
    """prefix_remote's timing, answering the start of one JSON object: whole (valid) at the suite's 8 tokens, a
    bare `{` (refused as invalid_output under an output schema) at the tenant audit's one token."""
    answer = '{"a": 1}'.__getitem__
    return FakeRemote(RemoteBehaviour(delay_s=0.003, prefill_s_per_token=0.0005, prefix_cache=kind,  # type: ignore[arg-type]
                                      answer=lambda ids, max_tokens: answer(slice(max_tokens))))  # fmt: skip


def test_under_an_output_schema_the_tenant_audit_times_first_tokens_and_finds_sharing_and_isolation() -> None:
    """A one-token answer is no JSON object: refused whole (502), its first token still streams; the audit times
    that, so the shared cache still fails and the salted one passes, each measured, never stopped."""
    for kind, verdict, finding in (("shared", "fail", "shared"), ("salted", "pass", "isolated")):
        with json_remote(kind) as remote:
            served = tenant_endpoint(remote.url)
            post = {**served.postprocess.model_dump(mode="python"), "output_schema": {"type": "object"}}
            gate = caching(served.with_changes(postprocess=post))
        audits = gate.measurements.model_dump(mode="json")["timing_audits"]
        assert audits["problem"] is None, audits["problem"]
        found = audits["isolation"]
        assert found is not None and found["finding"] == finding, found and found["reason"]
        assert found["samples"] in (8, 16) and found["prompt_tokens"] > 60, found  # a look every 8 rounds
        assert gate.verdict == verdict, gate.reason


def test_a_response_cache_detector_whose_answers_are_all_refused_stops_alone_and_the_tenant_audit_still_runs() -> None:
    """No answer of this remote is JSON: the detector's probes are refused and it stops (a warning naming it), while
    the tenant audit, timing streamed first tokens, still finds the salted cache isolated."""
    with prefix_remote("salted") as remote:
        served = tenant_endpoint(remote.url)
        post = {**served.postprocess.model_dump(mode="python"), "output_schema": {"type": "object"}}
        gate = caching(served.with_changes(postprocess=post))
    audits = gate.measurements.model_dump(mode="json")["timing_audits"]
    assert audits["response_cache"] is None and "response-cache timing:" in audits["problem"], audits["problem"]
    assert "invalid_output" in audits["problem"] and "tenant timing" not in audits["problem"]
    assert audits["isolation"]["finding"] == "isolated", audits["isolation"]["reason"]


@pytest.mark.slow
def test_the_tenant_audit_at_the_papers_250_per_side_finds_the_shared_cache() -> None:
    with prefix_remote("shared") as remote:
        leaky = caching(tenant_endpoint(remote.url, samples=250))
    found = leaky.measurements.model_dump(mode="json")["timing_audits"]["isolation"]
    assert leaky.verdict == "fail" and found["samples"] == 250 and found["p_cross_faster"] < 1e-20


# --- on the reference backend ----------------------------------------------------------------------------


@dataclasses.dataclass
class HiddenResponseCache:
    """A planted fault in front of a real engine: exact repeats are replayed from memory, unmarked."""

    engine: Any
    ignore_seed: bool = False
    """Key on the prompt and the sampling settings but not the seed, as many gateway caches do."""
    kept: dict[str, FinishEvent] = dataclasses.field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    async def submit(self, request: GenerationRequest) -> AsyncIterator[Event]:
        params = dataclasses.asdict(request.params)
        if self.ignore_seed:
            params.pop("seed")
        key = json.dumps([request.prompt, request.tenant, params], default=str)
        if key in self.kept:
            yield dataclasses.replace(self.kept[key], request_id=request.id)
            return
        async for event in self.engine.submit(request):
            if isinstance(event, FinishEvent):
                self.kept[key] = event
            yield event


def reference_with_prefix_cache() -> ServedModel:
    return ServedModel.model_validate(
        {
            "name": "audited",
            "weights": {"source": "zoo:tiny-primary"},
            "preprocess": {
                "chat_template": "none",
                "max_input_tokens": 96,
                "truncation": "left",
                "tenant_from": "header",
            },
            "runtime": {"max_model_len": 128, "kv_cache": {"prefix_caching": True}},
            "batching": {"mode": "continuous", "max_batch_size": 8},
            "postprocess": {"max_output_tokens": 16},
            "quality": {
                "suites": [{"name": "recall", "dataset": "zoo:recall", "limit": 8, "max_tokens": 16}],
                "cache_audit": {"repeat_samples": 16, "tenant_samples": 12},
            },
        }
    )


def test_a_hidden_response_cache_in_the_reference_engine_fails_and_the_real_engine_passes(tmp_path: Path) -> None:
    from servegate.runtime import build

    served = reference_with_prefix_cache()
    planted = caching(served, engine_factory=lambda s: HiddenResponseCache(build(s)))
    assert planted.verdict == "fail", planted.reason
    assert "an undeclared response cache" in planted.reason
    real = caching(served)
    assert real.verdict == "pass", real.reason
    assert real.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]["finding"] != "cache"


def test_on_the_reference_engine_a_seed_blind_cache_fails_and_servegates_own_response_cache_is_found() -> None:
    from servegate.runtime import build

    served = reference_with_prefix_cache()
    blind = caching(served, engine_factory=lambda s: HiddenResponseCache(build(s), ignore_seed=True))
    found = blind.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]
    assert blind.verdict == "fail" and found["finding"] == "cache_ignores_seed", found["reason"]
    assert "an undeclared response cache answers exact repeats and ignores the seed" in blind.reason
    cached = {"max_output_tokens": 16, "response_cache": {"enabled": True, "scope": "tenant"}}
    own = caching(served.with_changes(postprocess=cached))
    found = own.measurements.model_dump(mode="json")["timing_audits"]["response_cache"]
    assert own.verdict == "pass", own.reason
    assert found["finding"] == "cache" and found["header_hits"] == found["pairs"], found["reason"]  # keys on the seed


def test_under_an_output_schema_the_audit_keeps_answers_valid_and_still_times_them() -> None:
    """Past the end-of-sequence a JSON answer breaks the schema (502 invalid_output): the audit then asks for no
    `ignore_eos`, and its never-seen prompts keep the probe's JSON (digits swapped for digits), so it runs."""
    served = reference_with_prefix_cache().with_changes(
        preprocess={"chat_template": "none", "max_input_tokens": 96, "truncation": "left"},
        postprocess={"max_output_tokens": 32, "output_schema": {"type": "object"}},
        quality={"suites": [{"name": "json", "dataset": "zoo:json", "limit": 8, "max_tokens": 32,
                             "metrics": ["json_schema_valid"]}], "cache_audit": {"repeat_samples": 16}},
    )  # fmt: skip
    gate = caching(served)
    audits = gate.measurements.model_dump(mode="json")["timing_audits"]
    assert audits["problem"] is None, audits["problem"]
    timing = audits["response_cache"]
    assert not timing["ignore_eos"] and timing["finding"] in ("no_cache", "inconclusive"), timing["reason"]
    assert gate.verdict == "pass", gate.reason


@pytest.fixture(scope="module")
def long_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_long_context_llama(tmp_path_factory.mktemp("long-context"))


def test_a_prefix_cache_shared_across_tenants_on_the_reference_backend_shows_in_ttft(long_model: Path) -> None:
    """760-token prompts: a prefill of 30-60 ms against 8 ms from the prefix cache on a loaded 2-core machine."""
    audit = {"cache_audit": {"repeat_samples": 8, "tenant_samples": 16}}
    shared = caching(ServedModel.model_validate(long_context_manifest(long_model, "global", **audit)))
    found = shared.measurements.model_dump(mode="json")["timing_audits"]["isolation"]
    assert shared.verdict == "fail" and found["finding"] == "shared", found["reason"]
    assert "timing shows it: a prompt cache is shared across tenants" in shared.reason
    isolated = caching(ServedModel.model_validate(long_context_manifest(long_model, "tenant", **audit)))
    found = isolated.measurements.model_dump(mode="json")["timing_audits"]["isolation"]
    assert isolated.verdict == "pass", isolated.reason
    assert found["finding"] == "isolated", found["reason"]
    assert found["prompt_tokens"] > 700


def test_gate_check_exits_1_on_an_endpoint_with_a_hidden_response_cache(tmp_path: Path) -> None:
    """From the command line: the report names the finding and its figures, the exit code blocks the release."""
    with FakeRemote(RemoteBehaviour(delay_s=0.06, hidden_response_cache=True)) as remote:
        manifest = endpoint(remote.url).model_dump(mode="json")
        (tmp_path / "remote.yaml").write_text(json.dumps(manifest))
        done = subprocess.run(
            [sys.executable, "-m", "servegate.cli", "check", "remote.yaml", "--gate", "caching", "--json", "out.json"],
            capture_output=True, text=True, cwd=tmp_path, timeout=300,
            env={**os.environ, "SERVEGATE_CACHE": str(tmp_path / "cache")},
        )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    [gate] = [g for g in json.loads((tmp_path / "out.json").read_text())["gates"] if g["name"] == "caching"]
    assert gate["verdict"] == "fail" and "undeclared response cache" in gate["reason"]
    assert gate["measurements"]["timing_audits"]["response_cache"]["speedup"] > 1.5
