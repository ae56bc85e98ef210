"""Systems (a) and (b) of runtime_throughput.py: transformers `generate` in padded static batches, and
transformers' own continuous batching, each fed a workload of jobs (index, prompt, output_len, arrival_s)."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import ContinuousBatchingConfig, GenerationConfig

KV_BUDGET_BYTES = 2 * 2**30
"""KV-cache memory given to both continuous batchers (runtime_throughput.py gives servegate the same)."""


@dataclass(frozen=True)
class Job:
    """One request of the workload."""

    index: int
    prompt: list[int]
    output_len: int
    arrival_s: float
    """Seconds after the start of the run."""


def wait_until(start: float, at_s: float) -> None:
    delay = start + at_s - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


# --- (a) padded static batches of transformers generate ---------------------------------------------


def run_static_generate(model: Any, jobs: list[Job], batch: int = 16) -> tuple[float, list[float]]:
    """Serve jobs in arrival order with generate on left-padded batches; returns (wall_s, e2e per job)."""
    e2e = [0.0] * len(jobs)
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    start = time.perf_counter()
    while pending:
        wait_until(start, pending[0].arrival_s)
        now = time.perf_counter() - start
        group = [j for j in pending if j.arrival_s <= now][:batch]
        pending = [j for j in pending if j not in group]
        width = max(len(j.prompt) for j in group)
        ids = torch.tensor([[0] * (width - len(j.prompt)) + j.prompt for j in group], device=model.device)
        mask = torch.tensor([[0] * (width - len(j.prompt)) + [1] * len(j.prompt) for j in group], device=model.device)
        with torch.inference_mode():
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(j.output_len for j in group),
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        done = time.perf_counter() - start
        for j in group:
            e2e[j.index] = done - j.arrival_s
    return time.perf_counter() - start, e2e


# --- (b) transformers continuous batching ---------------------------------------------------------


def run_transformers_cb(
    model: Any, jobs: list[Job], max_batch_tokens: int, max_batch: int
) -> tuple[float, list[float]]:
    """Feed the transformers continuous-batching manager at arrival times; returns (wall_s, e2e per job)."""
    config = GenerationConfig(do_sample=False, max_new_tokens=max(j.output_len for j in jobs), eos_token_id=-1)
    # the same KV memory as servegate's pool (transformers would otherwise size it from free memory)
    per_token = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * model.config.head_dim
    per_token *= model.dtype.itemsize
    batching = ContinuousBatchingConfig(
        max_batch_tokens=max_batch_tokens,
        max_requests_per_batch=max_batch,
        num_blocks=max(1, KV_BUDGET_BYTES // (256 * per_token)),
    )
    manager = model.init_continuous_batching(generation_config=config, continuous_batching_config=batching)
    manager.start()
    e2e = [0.0] * len(jobs)
    finished: queue.Queue[tuple[int, float]] = queue.Queue()
    start = time.perf_counter()

    def collect() -> None:
        for _ in jobs:
            result = None
            while result is None:
                result = manager.get_result(timeout=1)
            finished.put((int(result.request_id.removeprefix("job-")), time.perf_counter() - start))

    collector = threading.Thread(target=collect, daemon=True)
    collector.start()
    for job in sorted(jobs, key=lambda j: j.arrival_s):
        wait_until(start, job.arrival_s)
        manager.add_request(job.prompt, request_id=f"job-{job.index}", max_new_tokens=job.output_len, eos_token_id=-1)
    collector.join()
    wall = time.perf_counter() - start
    manager.stop(block=True)
    while not finished.empty():
        index, at = finished.get()
        e2e[index] = at - jobs[index].arrival_s
    return wall, e2e
