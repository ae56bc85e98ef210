"""Workloads: when requests arrive and how long their prompts and outputs are.

Arrival processes (open loop, `rate_rps` requests/s on average):
    poisson  exponential gaps
    gamma    gamma gaps with shape = burstiness (1 is Poisson, < 1 burstier, > 1 smoother), same mean rate
    constant evenly spaced, one every 1 / rate_rps seconds (what guidellm's `constant` profile sends)
    closed   no schedule: `concurrency` requests in flight, each sent when one finishes

Lengths come from the workload's distributions or from an eval suite's prompts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError
from ruamel.yaml import YAML

from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.errors import ManifestError

LOGNORMAL_SIGMA = 0.5
"""Spread (sigma of log length) of `lognormal` length distributions; the manifest gives only mean, min, max."""


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload: its shape and, for open loops, its scheduled send offset."""

    prompt_tokens: int
    """Prompt length in tokens."""
    output_tokens: int
    """Output tokens to generate."""
    arrival_s: float | None
    """Seconds after the start of the run when it is scheduled (None: closed loop, sent when a slot frees)."""
    text: str | None = None
    """The exact prompt to send (from a prompt file); None: a fresh prompt of prompt_tokens is made."""


def sample_lengths(dist: LengthDistribution, n: int, rng: np.random.Generator) -> list[int]:
    """n lengths from a declared distribution, each within [min, max]."""
    if dist.distribution == "fixed":
        return [dist.mean] * n
    if dist.distribution == "uniform":
        return [int(x) for x in rng.integers(dist.min, dist.max + 1, size=n)]
    mu = np.log(dist.mean) - LOGNORMAL_SIGMA**2 / 2  # keeps the mean at dist.mean before clipping
    raw = rng.lognormal(mu, LOGNORMAL_SIGMA, size=n)
    return [int(x) for x in np.clip(np.rint(raw), dist.min, dist.max)]


def arrival_offsets(workload: Workload, n: int, rng: np.random.Generator) -> list[float] | None:
    """Scheduled send offsets in seconds for an open loop (None for a closed loop)."""
    if workload.arrival == "closed":
        return None
    assert workload.rate_rps is not None
    if workload.arrival == "constant":
        return [i / workload.rate_rps for i in range(n)]
    shape = 1.0 if workload.arrival == "poisson" else workload.burstiness
    gaps = rng.gamma(shape, 1.0 / (workload.rate_rps * shape), size=n)
    gaps[0] = 0.0  # the first request goes out at the start
    return [float(x) for x in np.cumsum(gaps)]


def make_requests(
    workload: Workload,
    seed: int = 0,
    num_requests: int | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> list[RequestSpec]:
    """The requests of one run; `prompt_lengths` (e.g. from a suite) replaces the prompt distribution."""
    rng = np.random.default_rng(seed)
    n = num_requests or workload.num_requests
    if prompt_lengths:
        pool = list(prompt_lengths)
        prompts = [pool[int(i)] for i in rng.integers(0, len(pool), size=n)]
    else:
        prompts = sample_lengths(workload.input_tokens, n, rng)
    outputs = sample_lengths(workload.output_tokens, n, rng)
    arrivals = arrival_offsets(workload, n, rng)
    return [
        RequestSpec(p, o, None if arrivals is None else arrivals[i])
        for i, (p, o) in enumerate(zip(prompts, outputs, strict=True))
    ]


def with_rate(workload: Workload, rate_rps: float) -> Workload:
    """The same workload as an open loop at another rate (Poisson unless it was gamma)."""
    arrival = workload.arrival if workload.arrival != "closed" else "poisson"
    return workload.model_copy(update={"arrival": arrival, "rate_rps": rate_rps, "concurrency": None})


def timed_requests(workload: Workload, rate_rps: float, seconds: float, seed: int, minimum: int) -> list[RequestSpec]:
    """`seconds` of the workload's requests sent as an open loop at `rate_rps` (with_rate), at least `minimum`."""
    return make_requests(with_rate(workload, rate_rps), seed, num_requests=max(minimum, round(rate_rps * seconds)))


def load_workload(path: str | Path) -> Workload:
    """Read a workload file: the `capacity.workload` section on its own, or a manifest holding one."""
    p = Path(path)
    if not p.is_file():
        raise ManifestError([f"{p}: file not found"])
    try:
        data = YAML(typ="safe").load(io.StringIO(p.read_text(encoding="utf-8")))
    except Exception as exc:
        raise ManifestError([f"{p}: cannot parse: {exc}"]) from None
    if isinstance(data, dict) and isinstance(data.get("capacity"), dict) and "workload" in data["capacity"]:
        data = data["capacity"]["workload"]
    elif isinstance(data, dict) and "workload" in data and len(data) == 1:
        data = data["workload"]
    try:
        return Workload.model_validate(data)
    except ValidationError as exc:
        problems = [f"{p}: workload.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ManifestError(problems) from None


def suite_prompt_lengths(suite: str, split: str = "test", limit: int | None = None) -> list[int]:
    """Prompt lengths (characters + 1 BOS, the zoo tokenizer's token count) of an eval suite's items."""
    from servegate import zoo

    loader = getattr(zoo, "load_suite", None)
    if loader is None:
        raise ManifestError([f"{suite}: the zoo suites are not available in this install"])
    items = loader(suite, split, limit)
    return [len(str(item["prompt"])) + 1 for item in items]
