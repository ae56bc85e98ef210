"""The latency model: how long one engine step takes on this machine, fitted from profiling.

A step computes a ragged batch of chunks (seq i gets n_i new tokens on top of s_i cached ones). Its
time is modelled as a non-negative combination of what the step does:

    t_step = c_step
           + c_prefill_token  x sum of n_i over prefill chunks (n_i > 1)
           + c_prefill_chunk  x number of prefill chunks
           + c_prefill_attn   x sum of n_i x (s_i + n_i) over prefill chunks   (query x key pairs)
           + c_decode_seq     x number of decode chunks (n_i = 1)
           + c_decode_attn    x sum of (s_i + 1) over decode chunks            (keys read)

plus, per request, `request_overhead_s` before its first token (HTTP, tokenization, queue hand-off),
`admission_delay_per_running_s` for every sequence running when it is sent (the server streams their
tokens on the event loop that must also read the new request), and `finish_overhead_s` after its last
one, and `arrival_overhead_s` added to a step that is running while a request is being admitted (the
server's CPU time for it competes with the engine's), and `completion_overhead_s` added to the step that
follows one which answered a request (the server sends the response meanwhile); every step is slower by
`load_slowdown_per_rps` per request/s sent just before it. So a request costs
t_queue + t_prefill(T_in) + T_out x t_decode + t_post, with t_prefill and t_decode read off the steps
the scheduler actually forms. Models are saved as JSON keyed by the served model and the hardware.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from servegate.contracts.files import write_atomic

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
"""Seconds of recent sends whose rate sets a step's load slowdown (load_slowdown_per_rps)."""

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


@dataclass
class LatencyModel:
    """Fitted step-time coefficients (seconds per unit) and per-request overheads, for one model on one machine."""

    coefficients: dict[str, float]
    """FEATURES -> seconds per unit."""
    request_overhead_s: float = 0.0
    """Seconds added before a request's first token (client, HTTP, tokenization, hand-off)."""
    finish_overhead_s: float = 0.0
    """Seconds from a request's last token to the end of its response."""
    arrival_overhead_s: float = 0.0
    """Seconds a request's admission (HTTP parsing, validation, tokenization) adds to the step in flight."""
    completion_overhead_s: float = 0.0
    """Seconds a request's answer adds to the next step when that step follows at once (the server sends the
    response on the interpreter the engine steps on)."""
    load_slowdown_per_rps: float = 0.0
    """Relative slowdown of a step per request/s sent in the LOAD_WINDOW_S before it: the CPU that HTTP
    work (the server's and, on a shared machine, its clients') takes from the engine beyond what the
    per-request costs above capture, fitted so that simulated runs match traced ones end to end."""
    admission_delay_per_running_s: float = 0.0
    """Seconds a request's admission is delayed per sequence running when it is sent (the server's event
    loop streams their tokens before it reads the new request)."""
    runtime_overhead_bytes: int | None = None
    """Peak resident memory of the profiling process beyond weights and KV pool (interpreter, torch, the
    largest step's activations), bytes."""
    step_jitter: float = 0.0
    """Relative spread (coefficient of variation) of measured step times around the fit."""
    step_jitter_correlation: float = 0.0
    """Correlation of one step's log slowdown with the next one's (back-to-back serving steps)."""
    key: str = ""
    """Profile key: fingerprint of the manifest with its batching section at defaults."""
    fingerprint: str = ""
    """Full fingerprint of the manifest that was profiled."""
    hardware: dict[str, Any] = field(default_factory=dict)
    """Where it was measured (see hardware_id)."""
    fit: dict[str, Any] = field(default_factory=dict)
    """Quality of the fit: samples, median and p90 relative error of step times."""

    def __post_init__(self) -> None:
        unknown = set(self.coefficients) - set(FEATURES)
        if unknown:
            raise ValueError(f"unknown latency coefficients {sorted(unknown)}; known: {', '.join(FEATURES)}")
        self.coefficients = {name: float(self.coefficients.get(name, 0.0)) for name in FEATURES}

    def step_time(self, chunks: Iterable[Chunk]) -> float:
        """Predicted seconds of one step."""
        c = self.coefficients
        return float(sum(c.get(name, 0.0) * x for name, x in zip(FEATURES, step_features(chunks), strict=True)))

    def prefill_time(self, prompt_tokens: int) -> float:
        """Predicted seconds of a step that prefills one prompt alone."""
        return self.step_time([(prompt_tokens, 0)])

    def decode_time(self, batch: int, context: int) -> float:
        """Predicted seconds of a decode step of `batch` sequences of `context` tokens each."""
        return self.step_time([(1, context - 1)] * batch)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LatencyModel:
        """Inverse of as_dict (unknown keys are ignored, missing coefficients are 0)."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def save(self, path: Path) -> Path:
        """Write as JSON atomically."""
        return write_atomic(path, json.dumps(self.as_dict(), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> LatencyModel:
        """Read a saved model."""
        return cls.from_dict(json.loads(path.read_text(encoding="utf-8")))


def fit_steps(samples: Sequence[StepSample]) -> tuple[dict[str, float], dict[str, Any]]:
    """Non-negative least squares on relative error: coefficients and the fit's quality."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"need at least {len(FEATURES)} measured steps to fit (got {len(samples)})")
    x = np.array([step_features(s.chunks) for s in samples], dtype=float)
    y = np.array([s.seconds for s in samples], dtype=float)
    coef, rel = _nonnegative_fit(x, y, 1.0 / np.maximum(y, 1e-6))  # relative: short steps count as much as long
    quality = {
        "samples": len(samples),
        "median_rel_error": float(np.median(rel)),
        "p90_rel_error": float(np.percentile(rel, 90)),
    }
    return dict(zip(FEATURES, (float(c) for c in coef), strict=True)), quality


def _nonnegative_fit(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares of y on the columns of x (each scaled to its maximum so that no feature's
    units dominate), optionally weighted per row: the coefficients and every row's relative error."""
    from scipy.optimize import nnls

    scale = x.max(axis=0)
    scale[scale == 0] = 1.0
    w = np.ones_like(y) if weights is None else weights
    coef, _ = nnls((x / scale) * w[:, None], y * w)
    coef = coef / scale
    return coef, np.abs(x @ coef - y) / y


@dataclass(frozen=True)
class ServingStep:
    """One step the engine ran while serving: its chunks, its duration in seconds, requests admitted meanwhile."""

    chunks: tuple[Chunk, ...]
    seconds: float
    arrivals: int
    began: float | None = None
    """When it began (perf_counter seconds in the serving process), if known."""
    ended: float | None = None
    """When it ended, if known."""
    after_completed: int = 0
    """Requests the step just before answered, when this one followed it at once (the responses were sent
    while this one ran)."""


@dataclass(frozen=True)
class ServingFit:
    """Coefficients fitted on serving steps (fit_serving_steps)."""

    coefficients: dict[str, float]
    """FEATURES -> seconds per unit."""
    admission_s: float
    """Seconds each request admitted during a step adds to it."""
    completion_s: float
    """Seconds each request answered by the previous step adds to a step that follows at once."""
    quality: dict[str, Any]
    """Steps fitted, median and p90 relative error, mean step."""

    def step_seconds(self, step: ServingStep) -> float:
        """Predicted duration of a traced step."""
        extra = self.admission_s * step.arrivals + self.completion_s * step.after_completed
        return LatencyModel(self.coefficients).step_time(step.chunks) + extra


def fit_serving_steps(steps: Sequence[ServingStep]) -> ServingFit:
    """Step coefficients and the per-admission and per-answer costs, fitted on steps measured inside the
    serving process.

    Non-negative least squares on absolute error, each step counted once per sequence in it: a request's
    latency is the sum of the steps it was in, so the fitted mean of the steps as requests see them equals
    the measured one. (A fit right in relative terms, as for the bare model steps, underestimates that sum
    whenever step times are skewed, as they are under load.)
    """
    if len(steps) < 4 * (len(FEATURES) + 2):
        raise ValueError(f"need at least {4 * (len(FEATURES) + 2)} serving steps to fit (got {len(steps)})")
    x = np.array([[*step_features(s.chunks), float(s.arrivals), float(s.after_completed)] for s in steps], dtype=float)
    y = np.array([s.seconds for s in steps], dtype=float)
    coef, rel = _nonnegative_fit(x, y, np.sqrt([len(s.chunks) for s in steps]))  # squared: once per sequence
    quality = {
        "serving_steps": len(steps),
        "serving_median_rel_error": float(np.median(rel)),
        "serving_p90_rel_error": float(np.percentile(rel, 90)),
        "serving_mean_step_s": float(y.mean()),
    }
    coefficients = dict(zip(FEATURES, (float(c) for c in coef[:-2]), strict=True))
    return ServingFit(coefficients, float(coef[-2]), float(coef[-1]), quality)


def residual_spread(model: LatencyModel, samples: Sequence[StepSample]) -> float:
    """Coefficient of variation of measured / predicted step time (the noise the simulator replays)."""
    ratios = np.array([s.seconds / max(model.step_time(s.chunks), 1e-9) for s in samples])
    return float(np.std(ratios) / max(np.mean(ratios), 1e-9))


def hardware_id() -> dict[str, Any]:
    """What the latency was measured on: CPU model, cores, accelerator (read without importing torch)."""
    cpu = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        match = re.search(r"model name\s*:\s*(.+)", text)
        cpu = match.group(1).strip() if match else cpu
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count() or 1, "machine": platform.machine()}
    gpus = sorted(Path("/proc/driver/nvidia/gpus").glob("*/information"))
    if gpus:
        match = re.search(r"Model:\s*(.+)", gpus[0].read_text(encoding="utf-8", errors="replace"))
        info["accelerator"] = match.group(1).strip() if match else "nvidia"
    torch = sys.modules.get("torch")  # recorded when already loaded (profiling), never imported just for this
    if torch is not None:
        info["torch_threads"] = torch.get_num_threads()
    return info


def hardware_key(hardware: dict[str, Any]) -> str:
    """A short file-name-safe id of a machine kind."""
    text = f"{hardware.get('accelerator') or hardware.get('cpu')}-{hardware.get('cores')}c"
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:80]


def profiles_dir() -> Path:
    """Where profiles are kept: $SERVEGATE_HOME/profiles (default ~/.cache/servegate/profiles)."""
    home = os.environ.get("SERVEGATE_HOME") or str(Path.home() / ".cache" / "servegate")
    return Path(home) / "profiles"


def profile_path(key: str, hardware: dict[str, Any], directory: Path | None = None) -> Path:
    """File of the profile for a profile key on a machine kind."""
    return (directory or profiles_dir()) / f"{key[:16]}-{hardware_key(hardware)}.json"
