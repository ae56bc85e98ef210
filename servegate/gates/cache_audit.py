"""Black-box response-cache detector (MLPerf TEST04): an exact repeat must not answer faster than a fresh request.

Each pair: the probe prompt is sent once (filling any cache there is), then in a seeded random order its exact
repeat and a fresh request of the same shape: the same prompt, the same max_tokens, another seed. Greedy
decoding ignores the seed, so both requests cost the engine the same work and find the same prefix cache,
but only the repeat can be answered from a cache of whole responses. With no response cache the two take
the same time; with one, the repeat is many times faster.

The speed-up is judged by two one-sided Mann-Whitney tests of fresh times against repeat times scaled by the
limit L (`quality.cache_audit.max_repeat_speedup`): fresh > L x repeat below alpha finds a cache; fresh < L x
repeat below alpha finds none; neither is inconclusive (a warning with the figures), never a failure: a
verdict must not depend on how busy a shared machine was. A declared cache is seen hitting in servegate's
X-Servegate-Cache header (its own cache) or in the timing (a cache below it). The data is looked at every
8 pairs and the detector stops at the first look that decides, each look at alpha over the number of looks
(Bonferroni), so stopping early does not raise the chance of a false finding.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Literal

from scipy.stats import mannwhitneyu

from servegate.contracts.quality_section import CacheAudit
from servegate.gates.http_probe import HttpProbe
from servegate.gates.result import Verdict

Finding = Literal["cache", "no_cache", "inconclusive"]
LOOK_EVERY = 8
"""Pairs between looks at the data: the detector stops at the first look that decides."""


@dataclass(frozen=True)
class RepeatTiming:
    """What the response-cache detector measured and found."""

    pairs: int
    declared: bool
    """Whether the manifest declares a response cache (postprocess.response_cache.enabled)."""
    fresh_median_ms: float
    repeat_median_ms: float
    speedup: float
    """Fresh median / repeat median."""
    max_speedup: float
    p_faster_than_limit: float
    """One-sided Mann-Whitney p that fresh times exceed max_speedup x repeat times (a cache answers repeats)."""
    p_within_limit: float
    """One-sided Mann-Whitney p that fresh times stay below max_speedup x repeat times (no cache)."""
    alpha: float
    """Level each look is judged at: quality.cache_audit.alpha over the number of looks."""
    header_hits: int
    """Repeats servegate's X-Servegate-Cache header marked `hit`."""
    finding: Finding
    verdict: Verdict
    reason: str


def judge_repeats(
    fresh: list[float], repeat: list[float], config: CacheAudit, alpha: float
) -> tuple[Finding, float, float]:
    """The finding and the two p-values for fresh and repeat times (seconds) against the declared limit."""
    scaled = [t * config.max_repeat_speedup for t in repeat]
    p_cache = float(mannwhitneyu(fresh, scaled, alternative="greater").pvalue)
    p_none = float(mannwhitneyu(fresh, scaled, alternative="less").pvalue)
    finding: Finding = "cache" if p_cache < alpha else "no_cache" if p_none < alpha else "inconclusive"
    return finding, p_cache, p_none


def _verdict(finding: Finding, declared: bool, header_hits: int, pairs: int) -> tuple[Verdict, str]:
    """The verdict and its opening words, from what the timing found and what the manifest declares."""
    if declared:
        if header_hits or finding == "cache":
            return "pass", "the declared response cache answers repeats"
        return "warn", f"the declared response cache did not hit: 0 of {pairs} exact repeats were answered from it"
    if finding == "cache":
        return "fail", "an undeclared response cache answers exact repeats"
    if finding == "no_cache":
        return "pass", "no response cache: exact repeats take as long as fresh requests"
    return "warn", "inconclusive: timing noise hides whether exact repeats are answered from a cache"


async def detect_response_cache(
    probe: HttpProbe,
    prompts: list[tuple[str, int]],
    config: CacheAudit,
    *,
    declared: bool,
    tenant: str | None,
    seed: int = 0,
) -> RepeatTiming:
    """Time `config.repeat_samples` repeat/fresh pairs over `prompts` ((text, max_tokens), reused in turn)."""
    rng = random.Random(seed)
    fresh: list[float] = []
    repeat: list[float] = []
    hits = 0
    looks = [n for n in range(LOOK_EVERY, config.repeat_samples, LOOK_EVERY)] + [config.repeat_samples]
    alpha = config.alpha / len(looks)  # Bonferroni over the looks: stopping early keeps the error rate
    for i in range(config.repeat_samples):
        if i in looks and judge_repeats(fresh, repeat, config, alpha)[0] != "inconclusive":
            break
        text, max_tokens = prompts[i % len(prompts)]
        base_seed = 1_000_003 * (i + 1) + seed
        await probe.complete(text, max_tokens=max_tokens, seed=base_seed, tenant=tenant)  # fills any cache
        order = ["repeat", "fresh"]
        rng.shuffle(order)  # neither kind always goes first: a drifting machine moves both
        for kind in order:
            if kind == "repeat":
                answer = await probe.complete(text, max_tokens=max_tokens, seed=base_seed, tenant=tenant)
                repeat.append(answer.seconds)
                hits += answer.cache == "hit"
            else:
                answer = await probe.complete(text, max_tokens=max_tokens, seed=base_seed + 1, tenant=tenant)
                fresh.append(answer.seconds)
    finding, p_cache, p_none = judge_repeats(fresh, repeat, config, alpha)
    f_med, r_med = statistics.median(fresh), statistics.median(repeat)
    speedup = f_med / r_med if r_med > 0 else float("inf")
    verdict, opening = _verdict(finding, declared, hits, len(repeat))
    reason = (
        f"{opening} (median {r_med * 1e3:.1f} ms for a repeat vs {f_med * 1e3:.1f} ms fresh: {speedup:.2f}x, "
        f"limit {config.max_repeat_speedup:g}x; Mann-Whitney p={p_cache:.2g} faster, p={p_none:.2g} within, "
        f"{len(repeat)} pairs; {hits} marked hit)"
    )
    return RepeatTiming(
        pairs=len(repeat),
        declared=declared,
        fresh_median_ms=round(f_med * 1e3, 3),
        repeat_median_ms=round(r_med * 1e3, 3),
        speedup=round(speedup, 3),
        max_speedup=config.max_repeat_speedup,
        p_faster_than_limit=p_cache,
        p_within_limit=p_none,
        alpha=alpha,
        header_hits=hits,
        finding=finding,
        verdict=verdict,
        reason=reason,
    )
