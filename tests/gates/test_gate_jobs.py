"""`gate check --jobs`: which gates run beside each other, the same verdicts as in one process, a worker that dies."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.cli import in_process_gate
from support.dying_worker import dies_in_process_2, has_a_bug

from servegate.cli.time_table import time_rows
from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.gates import gate_jobs
from servegate.gates.base import CheckResources, EnginePool, GateContext
from servegate.gates.check import check_manifest, evaluation_baseline, plan_gates
from servegate.gates.gate_jobs import Schedule, run_scheduled, schedule
from servegate.gates.result import GateReport, GateResult
from servegate.gates.suites.output_cache import OutputCache

QUICKSTART = Path(__file__).parents[2] / "examples/quickstart/manifest.yaml"
GIB = 1024**3


@pytest.fixture(scope="module")
def served() -> ServedModel:
    return load_manifest(QUICKSTART)


def _runtime(served: ServedModel, **fields: Any) -> ServedModel:
    return served.with_changes(runtime={**served.runtime.model_dump(mode="python"), **fields})


def _planned(served: ServedModel, forced: tuple[str, ...] = ()) -> list[Any]:
    return plan_gates(served.reference_form(), served, mode="reference", forced=forced)


def test_gates_that_share_outputs_run_together_and_timed_gates_run_alone(served: ServedModel) -> None:
    plan = schedule(_planned(served), [served], 2)
    assert plan.jobs == 2
    assert plan.groups == (("contract", "batching"), ("quantization", "truncation", "fallback", "load"))
    assert plan.alone == ("caching", "capacity")  # they time things: nothing may run beside them
    assert "process 2: quantization, truncation, fallback, load; then alone: caching, capacity" in plan.note()


def test_more_jobs_than_groups_and_one_job_keep_what_can_run(served: ServedModel) -> None:
    assert schedule(_planned(served), [served], 8).jobs == 4  # contract, the evaluation baseline's, batching, load
    one = schedule(_planned(served), [served], 1)
    assert one.jobs == 1 and one.note() == ""
    forced = schedule(_planned(served, ("truncation", "quantization")), [served], 2)
    assert forced.jobs == 1 and "fewer than two groups" in forced.reason


def test_servers_and_foreign_engines_keep_one_process(served: ServedModel) -> None:
    remote = _runtime(served.reference_form(), backend="vllm")
    assert "server" in schedule(_planned(served), [served, remote], 2).reason
    assert schedule(_planned(served), [served, remote], 2).jobs == 1
    assert schedule(_planned(served), [served], 2, own_engines=False).jobs == 1


def test_auto_counts_cores_threads_memory_and_the_models_size(
    served: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    planned = _planned(served)
    small = schedule(planned, [served], "auto", cores=16, available_bytes=64 * GIB)
    assert small.jobs == 1 and "too little work" in small.reason  # the quickstart's few MiB of weights
    monkeypatch.setattr(gate_jobs, "AUTO_MIN_WEIGHT_BYTES", 0)
    one_thread = _runtime(served, threads=1)
    assert schedule(planned, [one_thread], "auto", cores=2, available_bytes=64 * GIB).jobs == 2
    assert schedule(planned, [one_thread], "auto", cores=16, available_bytes=64 * GIB).jobs == 4
    two_threads = _runtime(served, threads=2)
    busy = schedule(planned, [two_threads], "auto", cores=2, available_bytes=64 * GIB)
    assert busy.jobs == 1 and "2 cores at 2 thread(s) per engine" in busy.reason
    tight = schedule(planned, [one_thread], "auto", cores=16, available_bytes=2 * GIB)
    assert tight.jobs == 1 and "2.0 GiB available" in tight.reason


def _outcome(report: GateReport) -> list[dict[str, Any]]:
    return [{k: v for k, v in g.to_dict().items() if k != "duration_s"} for g in report.gates]


def test_two_processes_give_the_verdicts_and_measurements_of_one(served: ServedModel, tmp_path: Path) -> None:
    """truncation and batching in two processes, then in one: the same results, field for field."""
    gates = ("truncation", "batching")
    apart = check_manifest(served, forced=gates, cache=OutputCache(tmp_path / "a"), jobs=2)
    together = check_manifest(served, forced=gates, cache=OutputCache(tmp_path / "b"), jobs=1)
    assert _outcome(apart) == _outcome(together)
    assert [g.verdict for g in apart.gates if g.name in gates] == ["pass", "pass"]
    assert apart.processes == {"batching": 2} and together.processes == {}
    assert apart.notes[0].startswith("gates ran in 2 processes (--jobs 2): process 1: truncation; process 2: batching")
    rows = [name for name, _, _ in time_rows(apart)]
    assert "batching (process 2)" in rows and "setup (process 2)" in rows
    assert apart.time_split is not None and apart.time_split["batching"]  # the worker's split came back


def _context(served: ServedModel, tmp_path: Path) -> tuple[GateContext, EnginePool]:
    reference = served.reference_form()
    pool = EnginePool()
    resources = CheckResources(engines=pool, cache=OutputCache(tmp_path / "cache"))
    ctx = GateContext(evaluation_baseline(reference, served), served, "reference", reference=reference,
                      resources=resources)  # fmt: skip
    return ctx, pool


def test_a_worker_that_dies_fails_its_gates_and_the_rest_still_run(served: ServedModel, tmp_path: Path) -> None:
    ctx, pool = _context(served, tmp_path)
    planned = _planned(served, ("truncation", "batching", "load"))
    plan = Schedule((("truncation",), ("batching",), ("load",)), (), "test")
    ran = run_scheduled(ctx, planned, pool, plan, worker=dies_in_process_2)
    by_name: dict[str, GateResult] = {r.name: r for r in ran.results}
    assert by_name["truncation"].verdict == "pass"  # the check's own process
    assert by_name["batching"].verdict == "fail"
    assert "its worker process ended before it answered" in by_name["batching"].reason
    assert by_name["load"].verdict == "pass"  # process 3 is not taken down with process 2
    assert [r.name for r in ran.results] == [p.name for p in planned]  # every planned gate, in order


def test_a_bug_in_a_worker_is_raised_not_reported(served: ServedModel, tmp_path: Path) -> None:
    ctx, pool = _context(served, tmp_path)
    planned = _planned(served, ("truncation", "batching"))
    with pytest.raises(TypeError, match="a bug in process 2"):
        run_scheduled(ctx, planned, pool, Schedule((("truncation",), ("batching",)), (), "test"), worker=has_a_bug)


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5"])
def test_jobs_must_be_a_count_or_auto(
    value: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gate = in_process_gate(monkeypatch, tmp_path, capsys)
    code, out, err = gate("check", str(QUICKSTART), "--jobs", value)
    assert code == 2, out
    assert f"error: --jobs takes a whole number of processes (1 or more) or auto, not {value!r}" in err
