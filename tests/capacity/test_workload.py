"""Arrival processes and length distributions."""

from __future__ import annotations

import numpy as np
import pytest

from servegate.capacity.bench.workload import load_workload, make_requests, sample_lengths, with_rate
from servegate.contracts.capacity_section import LengthDistribution, Workload
from servegate.contracts.errors import ManifestError


def gaps(workload: Workload) -> np.ndarray:
    arrivals = [r.arrival_s for r in make_requests(workload, seed=1)]
    return np.diff(np.asarray(arrivals))


def test_poisson_arrivals_have_the_declared_rate_and_exponential_spread() -> None:
    g = gaps(Workload(rate_rps=20, num_requests=4000))
    assert 1 / g.mean() == pytest.approx(20, rel=0.05)
    assert g.std() / g.mean() == pytest.approx(1.0, rel=0.08)  # exponential: CV 1


def test_gamma_burstiness_changes_the_spread_not_the_rate() -> None:
    bursty = gaps(Workload(arrival="gamma", rate_rps=20, burstiness=0.25, num_requests=4000))
    smooth = gaps(Workload(arrival="gamma", rate_rps=20, burstiness=4.0, num_requests=4000))
    for g in (bursty, smooth):
        assert 1 / g.mean() == pytest.approx(20, rel=0.08)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.1)  # CV = 1 / sqrt(shape)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.1)


def test_closed_loop_has_no_schedule() -> None:
    specs = make_requests(Workload(arrival="closed", concurrency=4, num_requests=10))
    assert all(s.arrival_s is None for s in specs)


def test_lengths_stay_within_bounds_and_keep_their_mean() -> None:
    rng = np.random.default_rng(0)
    uniform = sample_lengths(LengthDistribution(distribution="uniform", mean=40, min=10, max=70), 5000, rng)
    assert min(uniform) >= 10 and max(uniform) <= 70 and np.mean(uniform) == pytest.approx(40, rel=0.03)
    logn = sample_lengths(LengthDistribution(distribution="lognormal", mean=100, min=1, max=10_000), 5000, rng)
    assert np.mean(logn) == pytest.approx(100, rel=0.05)
    assert sample_lengths(LengthDistribution(mean=7, max=8), 3, rng) == [7, 7, 7]


def test_prompt_lengths_from_a_suite_replace_the_distribution() -> None:
    specs = make_requests(Workload(rate_rps=1, num_requests=50), prompt_lengths=[5, 9])
    assert {s.prompt_tokens for s in specs} == {5, 9}


def test_with_rate_turns_a_closed_loop_open() -> None:
    w = with_rate(Workload(arrival="closed", concurrency=3), 7.0)
    assert (w.arrival, w.rate_rps, w.concurrency) == ("poisson", 7.0, None)


def test_workload_file_standalone_or_inside_a_manifest(tmp_path) -> None:
    f = tmp_path / "w.yaml"
    f.write_text("arrival: closed\nconcurrency: 3\nnum_requests: 9\n")
    assert load_workload(f).concurrency == 3
    f.write_text("name: x\ncapacity:\n  workload:\n    rate_rps: 2.5\n")
    assert load_workload(f).rate_rps == 2.5
    f.write_text("arrival: closed\n")
    with pytest.raises(ManifestError, match="concurrency"):
        load_workload(f)


def test_prompt_lengths_from_a_zoo_suite() -> None:
    from servegate.capacity.bench.workload import suite_prompt_lengths
    from servegate.zoo import load_suite

    items = load_suite("arith", "test", 5)
    # the zoo's character tokenizer: one token per character plus <bos>
    assert suite_prompt_lengths("arith", limit=5) == [len(item["prompt"]) + 1 for item in items]
