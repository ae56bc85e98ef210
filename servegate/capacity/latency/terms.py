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

SHARE_WINDOW_S = 0.3
"""Seconds of recently served requests whose rate sets the share of the machine they hold
(ServingOverheads.serving_work_s): about ten requests' lives near the quickstart's knee on vLLM's CPU build, so a
burst of them shows as the load it is. Calibrated on two quickstart profiles of vLLM's CPU build (2026-12-05,
benchmarks/README.md; the second one's capacity set to its repeats' median, 39.5 requests/s, as its own knee was
read after floods: blackbox.sweep_start) against the p99 measured at half the capacity, 133-190 ms. Simulated
p99: 86 ms with 1 s (first profile only), 90-97 ms with 0.5 s, 120-133 ms with 0.35 s, 126-141 ms with 0.3 s,
146-229 ms with 0.25 s (p50 within 3 ms throughout)."""

MAX_SERVING_SHARE = 0.99
"""Most of the machine the requests are taken to hold, so the stretch stays finite (100x) where no capacity bounds
the rate (ServingOverheads.capacity_rps)."""

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
    """Seconds of the machine each request takes beyond what its steps and overheads show alone, once requests
    stream in (the client, the HTTP server, tokenization and streaming share the cores with the engine): at r
    requests/s served, the requests hold a share r x serving_work_s of the machine, and every part of a request
    (reaching the scheduler, its steps, its way out) takes 1 / (1 - share) as long (`stretch`): processor sharing,
    under which a request at half the capacity takes about twice as long as alone. Fitted so that the simulated
    capacity is the one the knee search measured (blackbox.fit_to_knee)."""
    capacity_rps: float = 0.0
    """The most requests/s the machine serves (the knee search's measured capacity; 0: not measured): the served
    rate the share is read at never exceeds it, as the machine's never does."""
    load_stretch_per_rps: float = 0.0
    """How much longer, relatively, every part of a request takes per request/s served, on top of the serving
    work's processor sharing: the stretch at r requests/s is (1 + r x load_stretch_per_rps) / (1 - r x
    serving_work_s). Processor sharing alone fixes where the machine runs out but grows too slowly below it on
    vLLM's CPU build; fitted to a steady stream's median, the serving work refitted to the knee beside it
    (stretch_fit.py)."""

    @property
    def stretches(self) -> bool:
        """Whether load stretches a request at all (serving work or a load stretch fitted)."""
        return bool(self.serving_work_s or self.load_stretch_per_rps)

    def stretch(self, rate_rps: float) -> float:
        """How much longer each part of a request takes while requests are served at `rate_rps` (1.0 when nothing
        `stretches`): the rate at most capacity_rps, the share at most MAX_SERVING_SHARE."""
        if not self.stretches:
            return 1.0
        rate = min(rate_rps, self.capacity_rps) if self.capacity_rps else rate_rps
        return (1.0 + rate * self.load_stretch_per_rps) / (1.0 - min(MAX_SERVING_SHARE, rate * self.serving_work_s))

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
    drift_spread: float = 0.0
    """Standard deviation of the log of a slowdown of the whole machine that lasts in time (0: none): under a
    steady stream an engine on shared cores runs slower for a second or two, then at its usual speed again, and
    every step and overhead started meanwhile shares it. Its median is 1 (the speed bursts measure); its mean,
    exp(drift_spread**2 / 2), is what a capacity sees, so the serving work is fitted to the knee under it. Fitted
    on a steady stream (drift_fit.py)."""
    drift_seconds: float = 0.0
    """Correlation time of that slowdown, seconds: an Ornstein-Uhlenbeck process in log space, whose correlation
    over a gap of d seconds is exp(-d / drift_seconds)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepJitter:
        """Inverse of as_dict."""
        return cls(**_known(cls, data))

    def as_dict(self) -> dict[str, float]:
        """Plain JSON-able form."""
        return asdict(self)
