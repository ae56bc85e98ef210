"""Black-box tenant isolation audit of prompt caches, after Gu et al., "Auditing Prompt Caching in Language Model
APIs" (ICML 2025): a cache shared across tenants shows in the time to first token, whatever the counters say.

Each round, tenant A sends a long never-seen prompt P (warming any cache), then, in a seeded random order:
tenant B sends a never-seen prompt F (fresh: a cache miss), tenant B sends P (cross: a hit only if caches
cross tenants), tenant A sends P again (own: the hit a cache gives, the positive control). Every request
has its own seed and max_tokens 1, so no response cache answers it, and is streamed and timed to its first
event: the time to the first token. Streamed, because an output contract (postprocess.output_schema or
max_output_bytes) judges a whole answer at its end: a one-token answer to random words is no valid JSON, and a
request refused non-streamed (HTTP 502) has no time, while a stream has sent its first token by the time the
refusal comes as its last event. Asking for an answer the contract could take instead cannot work: no model
answers random words with JSON a schema accepts, and a long answer would bury the prefill's difference in decode
time; nor does retrying as the response-cache detector does: another prompt of random words is refused just the
same. Prompt lengths come from the server's usage, else (a refused answer carries none) the manifest's tokenizer.

Three one-sided Mann-Whitney tests decide: own < fresh (the cache shows in timing at all), cross <
fresh (B reaches A's entries), cross > own (B does not). A leak needs cross < fresh below alpha, a median
speed-up of at least 1.25x and B getting at least half of A's own speed-up; isolation needs the control
(own < fresh below alpha, by at least 1.25x) and cross > own below alpha;
anything else is inconclusive (timing noise, or prompts too short for this model's prefill to show).
The data is looked at every LOOK_EVERY rounds and the audit stops at the first look that finds sharing or
isolation, each look judged at alpha over the number of looks (`look_points`), so stopping early does not raise the
chance of a false finding.

Sample size per side: for a shift of d standard deviations, a one-sided test at level alpha with power
1 - beta needs n = 2 (z_(1-alpha) + z_(1-beta))^2 / d^2 per side for the t-test, divided by the
Mann-Whitney test's asymptotic relative efficiency, at least 0.864 for any distribution (Hodges-Lehmann).
At alpha 0.01 and power 0.9 that is 30.1 / d^2: 40 per side (the default) detects d = 0.87, 250 (the
paper's) d = 0.35. A prefix-cache hit on a prompt that fills the context moves TTFT by many standard
deviations on an idle server; on a shared noisy machine d near 1 is what is left.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable
from typing import Literal

from scipy.stats import mannwhitneyu, norm

from servegate.contracts.quality_section import CacheAudit
from servegate.contracts.report.probes import TenantTiming
from servegate.gates.probes.http_probe import HttpProbe, chars_per_token, prompt_budget, random_text
from servegate.gates.result import Verdict

Finding = Literal["shared", "isolated", "inconclusive"]
MIN_ARE = 0.864
"""Lowest asymptotic relative efficiency of Mann-Whitney against the t-test, over all distributions."""
POWER = 0.9
"""Power the sample size is chosen for."""
MIN_CACHE_SPEEDUP = 1.25
"""Least median speed-up (fresh / hit) that counts as a cache hit: a prefix cache on a prompt that fills the
context saves most of the prefill (5x and more); a few percent is a warm code path, not a cache."""
PROMPT_SHARE = 0.85
"""Share of the prompt budget (input limit, context) the audit prompts fill: long, but never truncated."""


LOOK_EVERY = 8
"""Rounds between looks at the data, in both timing audits: an audit stops at the first look that decides."""


def look_points(rounds: int) -> list[int]:
    """The rounds after which an audit of at most `rounds` rounds looks at its data: every LOOK_EVERY, and at the
    end. Each look is judged at alpha / len(looks) (Bonferroni), so the chance of a false finding over all of
    them stays at most alpha however early the audit stops."""
    return [*range(LOOK_EVERY, rounds, LOOK_EVERY), rounds]


def samples_per_side(shift_sd: float, alpha: float, power: float = POWER) -> int:
    """Requests per side for a one-sided Mann-Whitney test to find a shift of `shift_sd` standard deviations."""
    z = norm.ppf(1 - alpha) + norm.ppf(power)
    return math.ceil(2 * z**2 / shift_sd**2 / MIN_ARE)


def detectable_shift_sd(n: int, alpha: float, power: float = POWER) -> float:
    """The smallest shift (in standard deviations) `n` requests per side find with the given power."""
    z = norm.ppf(1 - alpha) + norm.ppf(power)
    return math.sqrt(2 * z**2 / (n * MIN_ARE))


def judge_tenants(
    fresh: list[float], cross: list[float], own: list[float], alpha: float
) -> tuple[Finding, dict[str, float], float | None]:
    """The finding, the three p-values and the leak share for the three samples of times."""
    p = {
        "own_faster": float(mannwhitneyu(own, fresh, alternative="less").pvalue),
        "cross_faster": float(mannwhitneyu(cross, fresh, alternative="less").pvalue),
        "cross_slower_than_own": float(mannwhitneyu(cross, own, alternative="greater").pvalue),
    }
    f_med, c_med, o_med = statistics.median(fresh), statistics.median(cross), statistics.median(own)
    share = (f_med - c_med) / (f_med - o_med) if f_med > o_med else None
    cross_speedup = f_med / c_med if c_med > 0 else float("inf")
    own_speedup = f_med / o_med if o_med > 0 else float("inf")
    # a significant shift is not yet a cache: small systematic effects (a warm code path) are significant too
    if p["cross_faster"] < alpha and cross_speedup >= MIN_CACHE_SPEEDUP and (share is None or share >= 0.5):
        return "shared", p, share
    visible = p["own_faster"] < alpha and own_speedup >= MIN_CACHE_SPEEDUP
    if visible and p["cross_slower_than_own"] < alpha and p["cross_faster"] >= alpha:
        return "isolated", p, share
    return "inconclusive", p, share


def _reason(finding: Finding, p: dict[str, float], meds: tuple[float, float, float], tokens: int, alpha: float) -> str:
    f_med, c_med, o_med = (m * 1e3 for m in meds)
    figures = (
        f"TTFT median {c_med:.1f} ms for tenant B on A's prompts, {f_med:.1f} ms fresh, {o_med:.1f} ms for A's own "
        f"repeats; Mann-Whitney p={p['cross_faster']:.2g} (B faster than fresh), "
        f"p={p['own_faster']:.2g} (A's repeats faster than fresh); {tokens}-token prompts"
    )
    if finding == "shared":
        return f"a prompt cache is shared across tenants: {figures}"
    if finding == "isolated":
        return f"tenants are isolated: B gets none of A's cache speed-up ({figures})"
    if p["own_faster"] >= alpha:
        return f"inconclusive: the prefix cache does not show in TTFT here ({figures})"
    return f"inconclusive: timing noise hides whether tenant B reaches A's entries ({figures})"


def _prompt_tokens(
    texts: list[str], served_counts: list[int], count: Callable[[str], int] | None
) -> tuple[list[int], Literal["server", "tokenizer", "characters"]]:
    """The warmed prompts' lengths, all counted one way: by the server when every answer carried its usage, else
    by the manifest's tokenizer, else in characters."""
    if all(served_counts):
        return served_counts, "server"
    if count is not None:
        return [count(text) for text in texts], "tokenizer"
    return [len(text) for text in texts], "characters"


async def audit_tenants(
    probe: HttpProbe,
    config: CacheAudit,
    *,
    tenants: tuple[str, str],
    seed: int = 0,
    count: Callable[[str], int] | None = None,
) -> TenantTiming:
    """Run up to `config.tenant_samples` rounds (module docstring), stopping at the first look that decides, and
    judge them; `count` is the manifest's tokenizer's prompt length, for prompts whose answers the output contract
    refused (None: none at hand)."""
    rng = random.Random(seed)
    a, b = tenants
    ratio = await chars_per_token(probe, rng, a, count)
    chars = max(16, int(prompt_budget(probe.served, 1) * PROMPT_SHARE * ratio))
    fresh: list[float] = []
    cross: list[float] = []
    own: list[float] = []
    warmed_texts: list[str] = []
    served_counts: list[int] = []
    looks = look_points(config.tenant_samples)
    alpha = config.alpha / len(looks)  # Bonferroni over the looks: stopping early keeps the error rate
    for i in range(config.tenant_samples):
        if i in looks and judge_tenants(fresh, cross, own, alpha)[0] != "inconclusive":
            break
        warmed, other = random_text(rng, chars), random_text(rng, chars)
        # streamed and timed to the first event: an output contract's refusal of the whole answer comes after it
        first = await probe.first_token(warmed, seed=rng.randrange(2**31), tenant=a)
        warmed_texts.append(warmed)
        served_counts.append(first.prompt_tokens)
        sends = [("fresh", other, b), ("cross", warmed, b), ("own", warmed, a)]
        rng.shuffle(sends)
        for kind, text, tenant in sends:
            answer = await probe.first_token(text, seed=rng.randrange(2**31), tenant=tenant)
            {"fresh": fresh, "cross": cross, "own": own}[kind].append(answer.seconds)
    tokens, counted_by = _prompt_tokens(warmed_texts, served_counts, count)
    finding, p, share = judge_tenants(fresh, cross, own, alpha)
    meds = (statistics.median(fresh), statistics.median(cross), statistics.median(own))
    mean_tokens = round(sum(tokens) / len(tokens))
    verdicts: dict[str, Verdict] = {"shared": "fail", "isolated": "pass", "inconclusive": "warn"}
    verdict = verdicts[finding]
    return TenantTiming(
        samples=len(fresh),
        prompt_tokens=mean_tokens,
        tokens_counted_by=counted_by,
        fresh_median_ms=round(meds[0] * 1e3, 3),
        cross_median_ms=round(meds[1] * 1e3, 3),
        own_median_ms=round(meds[2] * 1e3, 3),
        p_own_faster=p["own_faster"],
        p_cross_faster=p["cross_faster"],
        p_cross_slower_than_own=p["cross_slower_than_own"],
        leak_share=None if share is None else round(share, 3),
        alpha=alpha,
        detectable_shift_sd=round(detectable_shift_sd(config.tenant_samples, alpha), 3),
        finding=finding,
        verdict=verdict,
        reason=_reason(finding, p, meds, mean_tokens, alpha),
    )
