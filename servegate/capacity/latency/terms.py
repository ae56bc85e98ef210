"""The terms of the latency model, in three frozen parts: step cost, serving overheads, step jitter.

A step computes a ragged batch of chunks (seq i gets n_i new tokens on top of s_i cached ones). Its
time is a non-negative combination of what the step does (StepCost):

    t_step = c_step
           + c_prefill_token  x sum of n_i over prefill chunks (n_i > 1)
           + c_prefill_chunk  x number of prefill chunks
           + c_prefill_attn   x sum of n_i x (s_i + n_i) over prefill chunks   (query x key pairs)
           + c_decode_seq     x number of decode chunks (n_i = 1)
           + c_decode_attn    x sum of (s_i + 1) over decode chunks            (keys read)

The serving path adds time around and inside the steps (ServingOverheads), and measured steps scatter
around the prediction (StepJitter). docs/latency-model.md gives every term, the formula it enters and
the profiling stage that fits it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

FEATURES = (
    "c_step",
    "c_prefill_token",
    "c_prefill_chunk",
    "c_prefill_attn",
    "c_decode_seq",
    "c_decode_attn",
)
"""Coefficient names, in the order of `step_features`."""

LOAD_WINDOW_S = 0.1
"""Seconds of recent sends whose rate sets a step's load slowdown (ServingOverheads.load_slowdown_per_rps)."""

SHARE_WINDOW_S = 1.0
"""Seconds of recent sends whose rate sets the CPU share serving work takes (ServingOverheads.serving_work_s): long
against one request's life (tens of milliseconds), so a Poisson stream's rate is read as its rate, not as the
chance clustering of a few sends."""

MAX_SERVING_SHARE = 0.95
"""Most of the CPU serving work is taken to hold: past it the engine is overloaded anyway, and the stretch stays
finite (20x)."""

Chunk = tuple[int, int]
"""(new tokens, tokens already cached) of one sequence in a step."""


def step_features(chunks: Iterable[Chunk]) -> list[float]:
    """The feature vector of one step (see the module notes); same order as FEATURES."""
    f = [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    for n, start in chunks:
        if n > 1:
            f[1] += n
            f[2] += 1
            f[3] += n * (start + n)
        else:
            f[4] += 1
            f[5] += start + 1
    return f


@dataclass(frozen=True)
class StepSample:
    """One measured step: its chunks and its duration in seconds."""

    chunks: tuple[Chunk, ...]
    seconds: float


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of `data` that name a field of the dataclass `cls`, as floats (unknown keys are dropped)."""
    names = {f.name for f in fields(cls)}
    return {k: float(v) for k, v in data.items() if k in names and v is not None}


@dataclass(frozen=True)
class StepCost:
    """Seconds per unit of each step feature (see the module notes): what one engine step costs."""

    c_step: float = 0.0
    """Seconds every step costs, whatever it holds (launch, scheduling, sampling set-up)."""
    c_prefill_token: float = 0.0
    """Seconds per prompt token computed in a prefill chunk."""
    c_prefill_chunk: float = 0.0
    """Seconds per prefill chunk (per-sequence work of a prefill: its own sampling and bookkeeping)."""
    c_prefill_attn: float = 0.0
    """Seconds per query x key pair of prefill attention."""
    c_decode_seq: float = 0.0
    """Seconds per decoding sequence in the step."""
    c_decode_attn: float = 0.0
    """Seconds per cached key a decoding sequence reads."""

    @classmethod
    def from_dict(cls, data: Mapping[str, float]) -> StepCost:
        """From FEATURES -> seconds per unit; missing names are 0, unknown names are an error."""
        unknown = set(data) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown latency coefficients {sorted(unknown)}; known: {', '.join(FEATURES)}")
        return cls(**_known(cls, data))

    def as_dict(self) -> dict[str, float]:
        """FEATURES -> seconds per unit, in FEATURES order."""
        return asdict(self)

    def values(self) -> tuple[float, ...]:
        """The coefficients in FEATURES order."""
        return tuple(getattr(self, name) for name in FEATURES)

    def seconds(self, chunks: Iterable[Chunk]) -> float:
        """Predicted seconds of one step of these chunks."""
        return float(sum(c * x for c, x in zip(self.values(), step_features(chunks), strict=True)))

    def scaled(self, factor: float) -> StepCost:
        """Every coefficient multiplied by `factor`."""
        return StepCost(*(factor * c for c in self.values()))

    def plus(self, **extra: float) -> StepCost:
        """These coefficients with `extra` seconds added to the named ones."""
        return replace(self, **{name: getattr(self, name) + value for name, value in extra.items()})


@dataclass(frozen=True)
class ServingOverheads:
    """What the serving path (HTTP, tokenization, streaming) adds to a request's time around and inside the steps."""

    request_s: float = 0.0
    """Seconds from sending a request to the scheduler seeing it (client, HTTP, tokenization, hand-off)."""
    finish_s: float = 0.0
    """Seconds from a request's last token to the end of its response."""
    arrival_s: float = 0.0
    """Seconds each request sent while a step runs adds to that step (its admission competes for the CPU)."""
    completion_s: float = 0.0
    """Seconds each request answered by a step adds to the next step when that one follows at once (the server
    sends the response on the interpreter the engine steps on)."""
    load_slowdown_per_rps: float = 0.0
    """Relative slowdown of a step per request/s sent in the LOAD_WINDOW_S before it: the CPU that HTTP work
    (the server's and, on a shared machine, its clients') takes from the engine beyond arrival_s, fitted so
    that simulated runs match traced ones end to end."""
    admission_delay_per_running_s: float = 0.0
    """Seconds a request's admission is delayed per sequence running when it is sent (the server's event loop
    streams their tokens before it reads the new request)."""
    serving_work_s: float = 0.0
    """CPU seconds each request's serving (HTTP, tokenization, streaming, in every process in front of the engine)
    takes on the cores the engine runs on, which lone requests and bursts do not show: at a send rate of r
    requests/s that work holds a share r x serving_work_s of the cores, and the engine's steps run on the rest, so
    they take 1 / (1 - share) as long (`stretch`). Only the steps: the engine's threads (one per core) wait for
    each other at every step, so serving work on any core holds the whole step up, while each single-threaded
    serving process mostly finds a core of its own (lone-request overheads stay as measured)."""

    def stretch(self, rate_rps: float) -> float:
        """How much longer steps take while requests are sent at `rate_rps` (1.0 without serving work), the share
        capped at MAX_SERVING_SHARE."""
        if not self.serving_work_s:
            return 1.0
        return 1.0 / (1.0 - min(MAX_SERVING_SHARE, rate_rps * self.serving_work_s))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ServingOverheads:
        """Inverse of as_dict (unknown keys are dropped, missing ones are 0)."""
        return cls(**_known(cls, data))

    def as_dict(self) -> dict[str, float]:
        """Plain JSON-able form."""
        return asdict(self)


@dataclass(frozen=True)
class StepJitter:
    """How measured steps scatter around the predicted ones: the noise the simulator replays."""

    spread: float = 0.0
    """Coefficient of variation of measured over predicted step time."""
    correlation: float = 0.0
    """Correlation of one step's log slowdown with the next one's (back-to-back serving steps): slow steps come
    in runs."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepJitter:
        """Inverse of as_dict."""
        return cls(**_known(cls, data))

    def as_dict(self) -> dict[str, float]:
        """Plain JSON-able form."""
        return asdict(self)
