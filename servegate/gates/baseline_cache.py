"""The key of a check's baseline cache as a whole, for a CI cache (`gate cache-key`, `actions/cache`, GitLab's
`cache:key`): one string that changes whenever any output `gate check` would cache for that baseline changes.

Each entry of the cache is keyed and checked on its own (`suites/output_cache.py`), so a restored folder can never
feed a wrong baseline; this key only decides which folder CI restores and when it saves a new one.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from servegate import __version__
from servegate.contracts.loading import load_fallback
from servegate.contracts.manifest import ServedModel
from servegate.gates.check import evaluation_baseline
from servegate.gates.lm_eval.tasks import load_any_suite
from servegate.gates.suites.output_cache import CACHE_FORMAT, cache_key, engine_identity

KEY_PREFIX = "servegate-baseline-"


@dataclass(frozen=True)
class BaselineCacheKey:
    """The CI cache key of a check's baseline and what it was computed from."""

    key: str
    """`servegate-baseline-` and 40 hex digits of sha256 over `parts`."""
    parts: dict[str, Any]
    """Per cached manifest (the baseline as the gates run it, and the fallback) its output cache key, fingerprint
    and engine identity; each suite's digest (declaration and items); the servegate version and cache format."""

    def to_dict(self) -> dict[str, Any]:
        """JSON form (`gate cache-key --json`)."""
        return {"key": self.key, **self.parts}


def _manifest_part(served: ServedModel) -> dict[str, Any]:
    return {
        "name": served.name,
        "fingerprint": served.fingerprint,
        "cache_key": cache_key(served),
        "engine": engine_identity(served),
    }


def baseline_cache_key(
    baseline: ServedModel, candidate: ServedModel, mode: Literal["reference", "change"]
) -> BaselineCacheKey:
    """The key of the outputs `gate check` caches for `baseline` (in reference mode, the candidate's reference
    form): every manifest whose whole-suite outputs it caches, with the suites they run on."""
    cached = {"baseline": baseline}
    if mode == "reference":
        cached["evaluated"] = evaluation_baseline(baseline, candidate)
    fallback = load_fallback(candidate)
    if fallback is not None:
        cached["fallback"] = fallback
    suites = {suite.name: load_any_suite(candidate, suite).digest for suite in candidate.quality.suites}
    parts: dict[str, Any] = {
        "servegate": __version__,
        "format": CACHE_FORMAT,
        "mode": mode,
        "manifests": {role: _manifest_part(served) for role, served in cached.items()},
        "suites": suites,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return BaselineCacheKey(KEY_PREFIX + digest[:40], parts)
