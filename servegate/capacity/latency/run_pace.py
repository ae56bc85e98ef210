"""How a run of the knee search is judged: the pace of its sends and of its answers, and whether the engine kept
up (blackbox.knee_sweep)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.latency.blackbox_fit import KEPT_UP


def pace(times: Sequence[float]) -> float | None:
    """Events per second: 1 / the Theil-Sen slope of the sorted times against their rank (the median of every
    pairwise slope, so neither the first nor the last event, nor one slow answer, sets it); None under three."""
    from scipy.stats import theilslopes

    if len(times) < 3:
        return None
    slope = float(theilslopes(sorted(times), np.arange(len(times)))[0])
    return 1.0 / slope if slope > 0 else None


def paces(records: Sequence[RequestRecord]) -> tuple[float | None, float | None]:
    """The pace of answers and the pace of scheduled sends (pace), requests/s. Answers: the sends' pace over
    1 + g, where g is how fast latency grows with the send time: a queue growing by g seconds per second of
    sending answers 1 / (1 + g) as fast as it is sent to. g is Tukey's resistant slope: the answered requests in
    order of sending, the difference of the median latency of the last third and of the first third over that of
    their median send times. Each answer is paired with its own send and each third's median is taken, so neither
    one slow answer nor answers that come in bursts (a batch finishing together) set it. The Theil-Sen slope of
    the sorted end times against their rank read such bursts as a pace: on vLLM's CPU build a run at 71.7
    requests/s, p50 end-to-end 1.3 s, as answered at 127.6/s."""
    sent = pace([r.scheduled for r in records])
    answered = sorted((r.scheduled, r.end - r.scheduled) for r in records if r.ok and r.end is not None)
    third = len(answered) // 3
    if sent is None or third < 1:
        return None, sent
    first, last = np.array(answered[:third]), np.array(answered[-third:])
    span = float(np.median(last[:, 0]) - np.median(first[:, 0]))
    growth = float(np.median(last[:, 1]) - np.median(first[:, 1])) / span if span > 0 else 0.0
    return sent / (1.0 + max(growth, -0.5)), sent


def kept_up_with(records: Sequence[RequestRecord]) -> bool:
    """Whether the engine answered about as fast as it was sent to: every request completed, and the answers'
    pace at least KEPT_UP of the sends'. Paces (not completions over the whole run) are compared, so a run short
    against its own latency is not taken for an overload, and robust ones, so one slow answer on a busy
    machine does not make one either."""
    done, sent = paces(records)
    return all(r.ok for r in records) and done is not None and sent is not None and done >= KEPT_UP * sent
