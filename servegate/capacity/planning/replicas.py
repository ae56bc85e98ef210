"""How many replicas a total load needs: ceil(peak rate / what one replica carries under the targets).

The total is either declared (`capacity.total_rate_rps`, or `gate plan --total-rate`) or read from a trace
of arrival times (`gate plan --arrival-trace`), whose peak is the most requests that arrived in any window
of `window_s` seconds, divided by the window: a deployment sized for the mean of a trace with a peak
falls behind during the peak.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError

PEAK_WINDOW_S = 60.0
"""Default window over which a trace's peak rate is counted, seconds."""


def peak_rate(arrivals: Sequence[float], window_s: float = PEAK_WINDOW_S) -> float:
    """The most arrivals within any `window_s` seconds, per second (a trace shorter than the window: its mean)."""
    if window_s <= 0:
        raise ServegateError(f"the peak window is a positive number of seconds (got {window_s})")
    times = sorted(arrivals)
    if len(times) < 2:
        return 0.0
    span = times[-1] - times[0]
    if span <= window_s:
        return (len(times) - 1) / span if span > 0 else 0.0
    most = max(bisect.bisect_right(times, t + window_s) - i for i, t in enumerate(times))
    return most / window_s


def load_arrival_trace(path: Path) -> list[float]:
    """Arrival times in seconds: one number a line, or JSON lines with `timestamp` (or `arrival_s`)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ServegateError(f"cannot read the arrival trace {path}: {exc.strerror}") from None
    out: list[float] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value: Any = json.loads(text)
            if isinstance(value, dict):
                value = value.get("timestamp", value.get("arrival_s"))
            out.append(float(value))
        except (ValueError, TypeError):
            raise ServegateError(
                f"{path}:{number}: expected an arrival time in seconds, or a JSON object with `timestamp`"
            ) from None
    if len(out) < 2:
        raise ServegateError(f"{path}: an arrival trace needs at least two arrival times")
    return out


@dataclass(frozen=True)
class ReplicaPlan:
    """Replicas for a total rate."""

    total_rps: float
    """The rate the deployment must carry (a trace's peak, or the declared total)."""
    per_replica_rps: float
    """What one replica carries under the targets."""
    replicas: int
    source: str
    """Where the total came from."""

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return dict(self.__dict__)


def replicas_for(total_rps: float, per_replica_rps: float, source: str) -> ReplicaPlan:
    """ceil(total / per replica); an error when one replica carries nothing under the targets."""
    if per_replica_rps <= 0:
        raise ServegateError(
            f"one replica carries no load under the latency targets, so no replica count reaches {total_rps:g} "
            "requests/s: relax the targets or use faster hardware (see the plan's why)"
        )
    return ReplicaPlan(total_rps, per_replica_rps, max(1, math.ceil(total_rps / per_replica_rps - 1e-9)), source)
