"""Benching a manifest's own server: start it, run the workload against it, stop it.

`gate bench MANIFEST`, `gate plan --verify` and the capacity gate all go through `bench_own_server`;
`gate profile` runs its own measurements through `against_server`, the same probe-run-close path.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from servegate.capacity.bench.load_generator import BenchResult, run_bench
from servegate.capacity.bench.process_memory import ProcessGroupMemory, measure_process_group
from servegate.capacity.bench.prompt_file import FilePrompt
from servegate.capacity.bench.run_metrics import SLO
from servegate.capacity.bench.targets import HttpTarget, PromptFactory
from servegate.contracts.capacity_section import Workload
from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel


class BenchProgress(Protocol):
    """Where a bench reports progress (the CLI's rich bar, a gate's progress hook)."""

    def start(self, description: str, total: int) -> None:
        """A new run of `total` requests."""

    def advance(self, steps: int = 1) -> None:
        """`steps` more requests done."""


@dataclass(frozen=True)
class RemoteServer:
    """A server that already runs (the manifest's endpoint): nothing to start or stop."""

    url: str
    """Base URL of its OpenAI API (…/v1)."""


@dataclass(frozen=True)
class ServerBench:
    """What benching a manifest's own server measured."""

    results: list[BenchResult]
    """One bench result per workload, in the order given."""
    peak_memory_bytes: int | None
    """Peak resident memory of the server process when it ran here (None for an endpoint)."""
    process_memory: ProcessGroupMemory | None = None
    """The resident memory of the server and every process it started (an engine's own processes), read after
    the last workload (None for an endpoint)."""


def load_tokenizer(path: str | Path | None) -> Any:
    """A Hugging Face tokenizer from a local directory (None when no path is given)."""
    if path is None:
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def manifest_tokenizer(served: ServedModel) -> Any:
    """The manifest's tokenizer (so prompts have exact token counts), or None when it cannot be found.

    A GGUF carries its tokenizer inside (its folder may hold nothing else), so it is read with the runtime's own
    loader: without it, prompt lengths fell back to characters, about 2x the tokens asked for on the bench's
    made-up words. Any other manifest's tokenizer is read from the folder holding its config.json (for an `hf:`
    source, without downloading the weights)."""
    try:
        if served.weights.format == "gguf":
            from servegate.runtime.model.weights import load_tokenizer as load_served_tokenizer

            return load_served_tokenizer(served)
        from servegate.capacity.memory.plan import model_config_path

        return load_tokenizer(model_config_path(served))
    except (OSError, ValueError, ServegateError):
        return None


def resolve_workload(
    served: ServedModel | None,
    workload_file: Path | None,
    rate: float | None = None,
    concurrency: int | None = None,
    requests: int | None = None,
) -> Workload:
    """The workload to run: --workload, else the manifest's capacity.workload, then --rate/--concurrency/--requests."""
    from servegate.capacity.bench.workload import load_workload

    if workload_file is not None:
        workload = load_workload(workload_file)
    elif served is not None and served.capacity.workload is not None:
        workload = served.capacity.workload
    elif rate is None and concurrency is None:
        raise ServegateError(
            "no workload: give --workload FILE, --rate R or --concurrency C (or declare capacity.workload)"
        )
    else:
        workload = Workload(arrival="closed", concurrency=concurrency) if concurrency else Workload(rate_rps=rate)
    update: dict[str, Any] = {}
    if rate is not None:
        update.update(arrival=workload.arrival if workload.arrival != "closed" else "poisson", rate_rps=rate)
        update["concurrency"] = None
    if concurrency is not None:
        update.update(arrival="closed", concurrency=concurrency, rate_rps=None)
    if requests is not None:
        update["num_requests"] = requests
    return Workload.model_validate({**workload.model_dump(), **update}) if update else workload


def own_server(served: ServedModel) -> AbstractContextManager[Any]:
    """The manifest's own server as a `with` block: its endpoint when it names one, else started here."""
    if served.runtime.external:
        return nullcontext(RemoteServer(str(served.runtime.endpoint_url)))
    from servegate.capacity.bench.local_server import LocalServer

    return LocalServer(served)


def peak_memory(server: Any) -> int | None:
    """Peak resident memory of a server that runs here, bytes (None for an endpoint or when unknown)."""
    peak = getattr(server, "peak_rss_bytes", None)
    return peak() if callable(peak) else None


def against_server(
    url: str,
    served: ServedModel | None,
    action: Callable[[Any], Awaitable[Any]],
    headers: dict[str, str] | None = None,
    model: str | None = None,
) -> Any:
    """What `action` returns when run on a client of the server at `url` (probed first, closed after).

    With `served`, requests carry what its server expects (its model name; a tenant when it reads one);
    `headers` are sent with every request; `model` (when given) is the model name, from the probe on.
    """

    async def go() -> Any:
        if served is not None:
            target = HttpTarget.for_manifest(url, served, headers=headers)
        else:
            target = HttpTarget(url, headers=headers)
        target.model = model or target.model  # the probe too: a server that requires `model` refuses it without
        try:
            await target.probe()
            return await action(target)
        finally:
            await target.aclose()

    return asyncio.run(go())


def bench_url(
    url: str,
    workload: Workload,
    *,
    served: ServedModel | None = None,
    model_name: str | None = None,
    tokenizer: Any = None,
    repeats: int = 1,
    rates: Sequence[float] | None = None,
    slo: SLO | None = None,
    prompt_lengths: Sequence[int] | None = None,
    seed: int = 0,
    progress: BenchProgress | None = None,
    label: str = "bench",
    headers: dict[str, str] | None = None,
    prompt_file: Sequence[FilePrompt] | None = None,
) -> BenchResult:
    """Probe the server at `url`, then run the bench (`repeats` runs, or one per rate of `rates`); with
    `prompt_file`, every run sends its prompts in order."""
    total = workload.num_requests * repeats * (len(rates) if rates else 1)

    async def run(target: Any) -> BenchResult:
        target.model = model_name or target.model
        if progress is not None:
            progress.start(label, total)
        return await run_bench(
            target,
            workload,
            PromptFactory(tokenizer),
            repeats=repeats,
            rates=rates,
            slo=slo,
            seed=seed,
            prompt_lengths=prompt_lengths,
            progress=progress.advance if progress is not None else None,
            target_name=url,
            prompt_file=prompt_file,
        )

    try:
        return against_server(url, served, run, headers, model_name)
    except ConnectionError as exc:
        raise ServegateError(str(exc)) from None


def bench_own_server(
    served: ServedModel,
    workloads: Sequence[Workload],
    *,
    server: AbstractContextManager[Any] | None = None,
    **options: Any,
) -> ServerBench:
    """Start the manifest's own server (or enter `server`, one already launched), bench each workload on it
    in turn, stop it. `options` go to bench_url."""
    with server if server is not None else own_server(served) as running:
        results = [bench_url(running.url, workload, served=served, **options) for workload in workloads]
        peak = peak_memory(running)
        pid = getattr(running, "pid", None)
        kv = served.runtime.kv_cache
        group = measure_process_group(pid, kv.memory_budget if kv is not None else 0) if pid is not None else None
    return ServerBench(results, peak, group)
