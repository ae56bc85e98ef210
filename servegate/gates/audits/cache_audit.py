"""Black-box response-cache detector (after MLPerf TEST04): an exact repeat must not answer faster than a request
no cache can hold.

Each round: the probe prompt is sent once (filling any cache there is), then, in a seeded random order, three
requests of the same shape: its exact repeat; the same prompt with another seed; and a never-seen prompt of the
probe's length in tokens (gates/audits/unseen_prompts.py: the probe's head, a new window before its last token, new in
every round). All ask greedily for the same max_tokens (the suite's, at most 16) with `ignore_eos`, so every
answer has the same length (under an output contract, which text past the end-of-sequence would break, the
suite's max_tokens without it). Greedy decoding ignores the seed, so the first two cost the engine the same work;
the third costs what an uncached answer costs, and finds what a prefix cache holds of the head as the others do.
A cache keyed on the seed answers only the repeat fast; a cache keyed on the prompt and sampling settings but
not the seed (many gateway caches: under greedy decoding the seed changes nothing) answers the repeat and the
other-seed request fast, and only the never-seen request shows it.

Findings, by one-sided Mann-Whitney tests against the limit L (`quality.cache_audit.max_repeat_speedup`):
- `cache`: other-seed times > L x repeat times (a cache keyed on the seed);
- `cache_ignores_seed`: never-seen times > L x repeat times and > L x other-seed times;
- `no_cache`: never-seen times < L x repeat times (another seed is no uncached reference: a cache may ignore it);
- else `inconclusive` (a warning with the figures, never a failure: a verdict must not depend on how busy a
  shared machine was).
A cache finding also needs a median speed-up of at least max(L, 1.25) (the tenant audit's rule: a significant
shift is not yet a cache), and each of its two routes is judged at half the level (Bonferroni), so there being
two does not raise the chance of a false one. Where a deployment refuses `ignore_eos` or stops early anyway, a
never-seen answer's time is scaled to the probe's answer length by the bound that favours the other finding
(time = a + b x tokens, a, b >= 0, lies between t x min(1, c/c') and t x max(1, c/c')), so a length difference
never makes a finding. The probe's first send is reported as the engine's own cost of that very request with no
cache holding it. A declared cache is seen hitting in servegate's X-Servegate-Cache header (its own cache) or in
the timing (a cache below it). The data is looked at every 8 rounds and the detector stops at the first look
that decides, each look at alpha over the number of looks (Bonferroni), so stopping early does not raise the
chance of a false finding either.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from scipy.stats import mannwhitneyu

from servegate.contracts.quality_section import CacheAudit
from servegate.contracts.report.probes import RepeatTiming
from servegate.gates.audits.tenant_audit import MIN_CACHE_SPEEDUP, look_points
from servegate.gates.audits.unseen_prompts import UnseenPrompts
from servegate.gates.probes.http_probe import HttpProbe, ProbeError, TimedAnswer, answers_checked, random_text
from servegate.gates.result import Verdict

Finding = Literal["cache", "cache_ignores_seed", "no_cache", "inconclusive"]
MAX_AUDIT_TOKENS = 16
"""Most tokens an audit request asks for: with `ignore_eos` every answer runs to its max_tokens, and 16 decode
steps already cost many times a cache lookup, on any model; more would only lengthen the audit."""


@dataclass
class RepeatSamples:
    """The times (seconds) of the detector's rounds: the three timed kinds, and what each round's first send cost."""

    repeat: list[float] = field(default_factory=list)
    other_seed: list[float] = field(default_factory=list)
    unseen: list[float] = field(default_factory=list)
    """Never-seen requests as timed."""
    unseen_low: list[float] = field(default_factory=list)
    """Never-seen times scaled to the probe's answer length by the bound below the truth (for a cache finding)."""
    unseen_high: list[float] = field(default_factory=list)
    """... and by the bound above it (for a no-cache finding)."""
    first_send: list[float] = field(default_factory=list)
    """Each probe prompt's first send: the engine's own cost of that request (unless a cache below kept it from an
    earlier gate)."""


def judge_repeats(
    fresh: list[float], repeat: list[float], config: CacheAudit, alpha: float
) -> tuple[Literal["cache", "no_cache", "inconclusive"], float, float]:
    """The finding and the two p-values for `fresh` times (seconds) against `repeat` times and the declared limit."""
    scaled = [t * config.max_repeat_speedup for t in repeat]
    p_cache = float(mannwhitneyu(fresh, scaled, alternative="greater").pvalue)
    p_none = float(mannwhitneyu(fresh, scaled, alternative="less").pvalue)
    return ("cache" if p_cache < alpha else "no_cache" if p_none < alpha else "inconclusive"), p_cache, p_none


def _speedup(slow: list[float], fast: list[float]) -> float:
    """Median of `slow` / median of `fast`."""
    f = statistics.median(fast)
    return statistics.median(slow) / f if f > 0 else float("inf")


def judge_samples(s: RepeatSamples, config: CacheAudit, alpha: float) -> tuple[Finding, dict[str, float]]:
    """The finding and its p-values (module docstring) for the samples of one look, at level `alpha`."""
    half = alpha / 2  # two routes to a cache finding: Bonferroni keeps their union at alpha
    floor = max(config.max_repeat_speedup, MIN_CACHE_SPEEDUP)
    _, seed_faster, seed_within = judge_repeats(s.other_seed, s.repeat, config, half)
    _, unseen_repeat_faster, _ = judge_repeats(s.unseen_low, s.repeat, config, half)
    _, unseen_other_faster, _ = judge_repeats(s.unseen_low, s.other_seed, config, half)
    _, _, unseen_within = judge_repeats(s.unseen_high, s.repeat, config, alpha)
    p = {
        "seed_faster": seed_faster,
        "seed_within": seed_within,
        "unseen_faster": max(unseen_repeat_faster, unseen_other_faster),
        "unseen_within": unseen_within,
    }
    if seed_faster < half and _speedup(s.other_seed, s.repeat) >= floor:
        return "cache", p
    both_fast = min(_speedup(s.unseen_low, s.repeat), _speedup(s.unseen_low, s.other_seed)) >= floor
    if p["unseen_faster"] < half and both_fast:
        return "cache_ignores_seed", p
    if unseen_within < alpha:  # only a request no cache can hold shows the uncached cost: another seed may not
        return "no_cache", p
    return "inconclusive", p


def _verdict(finding: Finding, declared: bool, header_hits: int, pairs: int) -> tuple[Verdict, str]:
    """The verdict and its opening words, from what the timing found and what the manifest declares."""
    ignores = (
        "the same prompt with another seed is answered from it too, which under sampling (temperature > 0) "
        "returns one answer whatever the seed"
    )
    if declared:
        if finding == "cache_ignores_seed":  # servegate's own cache keys on the seed: this one is another
            return "warn", f"a response cache answers exact repeats and ignores the seed: {ignores}"
        if header_hits or finding == "cache":
            return "pass", "the declared response cache answers repeats"
        return "warn", f"the declared response cache did not hit: 0 of {pairs} exact repeats were answered from it"
    if finding == "cache":
        return "fail", "an undeclared response cache answers exact repeats"
    if finding == "cache_ignores_seed":
        return "fail", f"an undeclared response cache answers exact repeats and ignores the seed: {ignores}"
    if finding == "no_cache":
        return "pass", "no response cache: exact repeats take as long as never-seen requests of the same shape"
    return "warn", "inconclusive: timing noise hides whether exact repeats are answered from a cache"


async def _takes_ignore_eos(probe: HttpProbe, rng: random.Random, tenant: str | None) -> bool:
    """Whether the deployment answers a request with `ignore_eos` (one short request): then every answer of the
    audit runs to its max_tokens and a never-seen prompt's answer is as long as the probe's."""
    try:
        await probe.complete(random_text(rng, 24), max_tokens=1, seed=rng.randrange(2**31), tenant=tenant,
                             ignore_eos=True)  # fmt: skip
    except ProbeError:  # a remote that refuses the field: answers keep their own lengths, bounded as described
        return False
    return True


UNSEEN_TRIES = 3
"""Never-seen prompts tried in a round when the deployment refuses an answer as breaking its output contract."""


async def _send_unseen(
    send: Callable[[str, int, int], Awaitable[TimedAnswer]],
    unseen: UnseenPrompts,
    text: str,
    rng: random.Random,
    seed: int,
    max_tokens: int,
) -> TimedAnswer:
    """A never-seen prompt's answer; one the output contract refuses (a new prompt may lead the model off the
    format) is replaced by another never-seen prompt, up to UNSEEN_TRIES."""
    for _ in range(UNSEEN_TRIES - 1):
        try:
            return await send(unseen.variant(text, rng), seed, max_tokens)
        except ProbeError as exc:
            if exc.code != "invalid_output":
                raise
    return await send(unseen.variant(text, rng), seed, max_tokens)


async def detect_response_cache(
    probe: HttpProbe,
    prompts: list[tuple[str, int]],
    config: CacheAudit,
    *,
    declared: bool,
    tenant: str | None,
    unseen: UnseenPrompts | None = None,
    seed: int = 0,
) -> RepeatTiming:
    """Time up to `config.repeat_samples` rounds over `prompts` ((text, max_tokens), reused in turn) and judge them;
    `unseen` makes the never-seen prompts (by characters when None)."""
    rng = random.Random(seed)
    unseen = unseen if unseen is not None else UnseenPrompts()
    unseen.sent.update(text for text, _ in prompts)
    # past the end-of-sequence an answer breaks an output contract: there the answers keep their own lengths
    exact = not answers_checked(probe.served) and await _takes_ignore_eos(probe, rng, tenant)

    async def send(prompt: str, request_seed: int, max_tokens: int) -> TimedAnswer:
        return await probe.complete(prompt, max_tokens=max_tokens, seed=request_seed, tenant=tenant, ignore_eos=exact)

    s = RepeatSamples()
    hits = shape_mismatches = length_mismatches = 0
    seen: set[str] = set()
    looks = look_points(config.repeat_samples)
    alpha = config.alpha / len(looks)  # Bonferroni over the looks: stopping early keeps the error rate
    for i in range(config.repeat_samples):
        if i in looks and judge_samples(s, config, alpha)[0] != "inconclusive":
            break
        text, suite_tokens = prompts[i % len(prompts)]
        max_tokens = min(suite_tokens, MAX_AUDIT_TOKENS) if exact else suite_tokens
        base_seed = 1_000_003 * (i + 1) + seed
        first = await send(text, base_seed, max_tokens)  # fills any cache
        if text not in seen:
            s.first_send.append(first.seconds)
            seen.add(text)
        kinds = ["repeat", "other_seed", "unseen"]
        rng.shuffle(kinds)  # no kind always goes first: a drifting machine moves all three
        for kind in kinds:
            if kind == "repeat":
                answer = await send(text, base_seed, max_tokens)
                s.repeat.append(answer.seconds)
                hits += answer.cache == "hit"
            elif kind == "other_seed":
                s.other_seed.append((await send(text, base_seed + 1, max_tokens)).seconds)
            else:
                answer = await _send_unseen(send, unseen, text, rng, base_seed + 2, max_tokens)
                shape_mismatches += answer.prompt_tokens != first.prompt_tokens
                length_mismatches += answer.completion_tokens != first.completion_tokens
                ratio = max(1, first.completion_tokens) / max(1, answer.completion_tokens)
                s.unseen.append(answer.seconds)
                s.unseen_low.append(answer.seconds * min(1.0, ratio))
                s.unseen_high.append(answer.seconds * max(1.0, ratio))
    finding, p = judge_samples(s, config, alpha)
    verdict, opening = _verdict(finding, declared, hits, len(s.repeat))
    meds = {
        name: statistics.median(getattr(s, name)) * 1e3 for name in ("repeat", "other_seed", "unseen", "first_send")
    }
    speedup, seed_speedup = _speedup(s.unseen, s.repeat), _speedup(s.other_seed, s.repeat)
    reason = (
        f"{opening} (median {meds['repeat']:.1f} ms for a repeat, {meds['other_seed']:.1f} ms with another seed, "
        f"{meds['unseen']:.1f} ms for a never-seen prompt of the same shape ({speedup:.2f}x the repeat), "
        f"{meds['first_send']:.1f} ms for a prompt's first send; limit {config.max_repeat_speedup:g}x; Mann-Whitney "
        f"p={p['seed_faster']:.2g} that the repeat beats another seed, p={p['unseen_faster']:.2g} that both beat "
        f"a never-seen prompt, p={p['unseen_within']:.2g} that neither does; {len(s.repeat)} rounds; {hits} marked hit)"
    )
    return RepeatTiming(
        pairs=len(s.repeat),
        declared=declared,
        repeat_median_ms=round(meds["repeat"], 3),
        other_seed_median_ms=round(meds["other_seed"], 3),
        unseen_median_ms=round(meds["unseen"], 3),
        first_send_median_ms=round(meds["first_send"], 3),
        speedup=round(speedup, 3),
        seed_speedup=round(seed_speedup, 3),
        max_speedup=config.max_repeat_speedup,
        p_seed_faster=p["seed_faster"],
        p_seed_within=p["seed_within"],
        p_unseen_faster=p["unseen_faster"],
        p_unseen_within=p["unseen_within"],
        alpha=alpha,
        header_hits=hits,
        ignore_eos=exact,
        unseen_unit=unseen.unit,
        unseen_shape_mismatches=shape_mismatches,
        unseen_length_mismatches=length_mismatches,
        finding=finding,
        verdict=verdict,
        reason=reason,
    )
