"""The latency model: how long one engine step takes on this machine, and what serving adds, fitted by `gate profile`.

A `LatencyModel` is four frozen parts: the step cost (seconds per unit of what a step computes,
terms.StepCost), the serving overheads around and inside the steps (terms.ServingOverheads), the step
jitter the simulator replays (terms.StepJitter), and where it comes from with how well each stage fit
(provenance.Provenance, provenance.FitQuality). A request costs
t_queue + t_prefill(T_in) + T_out x t_decode + t_post, with t_prefill and t_decode read off the steps
the scheduler actually forms (simulate.py). docs/latency-model.md gives every term, its formula, and the
profiling stage and data that fit it.

Models are saved as JSON (PROFILE_FORMAT) keyed by the served model and the hardware (provenance.profile_path).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.capacity.latency.provenance import FitQuality, Provenance
from servegate.capacity.latency.terms import Chunk, ServingOverheads, StepCost, StepJitter
from servegate.contracts.errors import ServegateError
from servegate.contracts.files import write_atomic

PROFILE_FORMAT = 2
"""Version of the saved JSON: 2 holds the model's parts as objects (`steps`, `overheads`, `jitter`,
`provenance`, `fit`); files of format 1 (one flat object with `coefficients`) are refused with a message
to profile again."""


@dataclass(frozen=True)
class LatencyModel:
    """Step cost, serving overheads, step jitter and provenance of one served model on one machine."""

    steps: StepCost
    """Seconds per unit of what a step computes."""
    overheads: ServingOverheads = field(default_factory=ServingOverheads)
    """What the serving path adds around and inside the steps."""
    jitter: StepJitter = field(default_factory=StepJitter)
    """How measured steps scatter around the prediction."""
    provenance: Provenance = field(default_factory=Provenance)
    """What was profiled, where and when."""
    fit: FitQuality = field(default_factory=FitQuality)
    """How well each profiling stage fit."""
    runtime_overhead_bytes: int | None = None
    """Peak resident memory of the profiling process beyond weights and KV pool (interpreter, torch, the
    largest step's activations), bytes (memory/plan.py's runtime term)."""

    def step_time(self, chunks: Iterable[Chunk]) -> float:
        """Predicted seconds of one step (step cost alone: the serving overheads enter in the simulator)."""
        return self.steps.seconds(chunks)

    def prefill_time(self, prompt_tokens: int) -> float:
        """Predicted seconds of a step that prefills one prompt alone."""
        return self.step_time([(prompt_tokens, 0)])

    def decode_time(self, batch: int, context: int) -> float:
        """Predicted seconds of a decode step of `batch` sequences of `context` tokens each."""
        return self.step_time([(1, context - 1)] * batch)

    def as_dict(self, *, samples: bool = True) -> dict[str, Any]:
        """Plain JSON-able form, as saved (without the measured steps when not `samples`)."""
        return {
            "format": PROFILE_FORMAT,
            "steps": self.steps.as_dict(),
            "overheads": self.overheads.as_dict(),
            "jitter": self.jitter.as_dict(),
            "runtime_overhead_bytes": self.runtime_overhead_bytes,
            "provenance": self.provenance.as_dict(),
            "fit": self.fit.as_dict(samples=samples),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "the profile") -> LatencyModel:
        """Inverse of as_dict; a profile of an older format raises a ServegateError saying to profile again."""
        found = data.get("format", 1)
        if found != PROFILE_FORMAT:
            raise ServegateError(
                f"{source} is a latency profile of format {found}; this servegate reads format {PROFILE_FORMAT}: "
                "run `gate profile` on the manifest again (or `gate plan --profile`)"
            )
        overhead = data.get("runtime_overhead_bytes")
        return cls(
            steps=StepCost.from_dict(data["steps"]),
            overheads=ServingOverheads.from_dict(data.get("overheads") or {}),
            jitter=StepJitter.from_dict(data.get("jitter") or {}),
            provenance=Provenance.from_dict(data.get("provenance") or {}),
            fit=FitQuality.from_dict(data.get("fit") or {}),
            runtime_overhead_bytes=int(overhead) if overhead is not None else None,
        )

    def save(self, path: Path) -> Path:
        """Write as JSON atomically."""
        return write_atomic(path, json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> LatencyModel:
        """Read a saved model (see from_dict for older files)."""
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")), source=str(path))
