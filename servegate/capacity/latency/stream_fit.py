"""What a black-box profile fits on its steady stream, in order: the middle, the tail under it, the middle again.

The stretch's linear part is fitted to the stream's median first (stretch_fit.py), then the machine's drift to its
p95 with that stretch in place (drift_fit.py). The drift's mean slows every step, so its refit to the knee takes
serving work off and the stream's median falls: when a drift was fitted, the stretch is fitted again under it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from servegate.capacity.bench.run_metrics import RequestRecord
from servegate.capacity.bench.workload import RequestSpec
from servegate.capacity.latency.blackbox_fit import SteadyStream
from servegate.capacity.latency.drift_fit import fit_drift
from servegate.capacity.latency.model import LatencyModel
from servegate.capacity.latency.simulate import SimSetup
from servegate.capacity.latency.stretch_fit import fit_load_stretch


def fit_stream(
    setup: SimSetup,
    model: LatencyModel,
    specs: Sequence[RequestSpec],
    records: Sequence[RequestRecord],
    rate_rps: float,
    refit: Callable[[LatencyModel], LatencyModel],
) -> tuple[LatencyModel, SteadyStream | None]:
    """The model with the load stretch and the drift fitted on a measured stream, and the stream's record (None
    when fewer than three of its requests were answered). `refit` fits the knee again (blackbox.fit_to_knee)."""
    model, first = fit_load_stretch(setup, model, specs, records, rate_rps, refit=refit)
    model, stream = fit_drift(setup, model, specs, records, rate_rps, refit=refit)
    if stream is None or first is None:
        return model, stream
    last = first
    if stream.drift_spread:
        model, again = fit_load_stretch(setup, model, specs, records, rate_rps, refit=refit)
        last = again or first
    return model, replace(
        stream,
        simulated_p50_ms=first.simulated_p50_ms,
        fitted_p50_ms=last.fitted_p50_ms,
        load_stretch_per_rps=last.load_stretch_per_rps,
    )
