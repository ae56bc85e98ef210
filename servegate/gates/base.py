"""What a gate is, and the context it runs in: the two manifests, engines, suites and progress.

A gate compares a candidate with a baseline. To blame the right change, quality gates build an
*isolated* candidate: the baseline with only the fields the gate is about taken from the candidate
(`GateContext.isolated`), so an unsafe truncation limit never fails the quantization gate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import ValidationError

from servegate.contracts.errors import RemoteUnavailable, ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.gates.lm_eval.tasks import load_any_suite, run_any_items
from servegate.gates.result import AnyMeasurements, GateResult, Verdict, labelled
from servegate.gates.suites.evaluation import ItemOutput, SuiteData, SuiteItem, SuiteRun, score_run
from servegate.gates.suites.output_cache import OutputCache, cache_key
from servegate.gates.time_split import TimeSplit
from servegate.runtime.engine.interface import Engine

EngineFactory = Callable[[ServedModel], Engine]


class GateSetupError(ServegateError):
    """A gate could not set up what it compares (e.g. an isolated candidate that does not validate)."""


def default_engine_factory(served: ServedModel) -> Engine:
    """`servegate.runtime.build`, imported on first use (it loads torch and transformers)."""
    try:
        from servegate.runtime import build
    except ImportError as exc:
        raise GateSetupError(f"the reference runtime is not available: {exc}") from exc
    return build(served)


RUNTIME_ENGINE_FACTORY = default_engine_factory
"""The runtime's own factory, as imported: a worker process of `gate check --jobs` builds its engines with it, so a
check whose pool builds them any other way (a caller's factory, a test's double patched in) keeps to one process."""


class EnginePool:
    """Builds one engine per manifest fingerprint (and tag) and shuts them all down at the end."""

    def __init__(self, factory: EngineFactory | None = None) -> None:
        self._factory = factory or default_engine_factory
        self._engines: dict[tuple[str, str], Engine] = {}
        self._vllm: dict[str, Engine] = {}
        """Running vLLM and llama.cpp servers by launch key: manifests that differ only in front share one."""
        self.built = 0
        self.split = TimeSplit()
        """Where building and starting engines is charged as "model loads" (CheckResources wires the check's)."""

    @property
    def runtime_engines(self) -> bool:
        """Whether the pool builds the runtime's own engines, as a worker process of `gate check --jobs` would."""
        return self._factory is RUNTIME_ENGINE_FACTORY

    @property
    def factory(self) -> EngineFactory:
        """Builds an engine for a manifest (not started); vLLM servers are started once per launch key."""
        return self._build_unstarted

    def _build_unstarted(self, served: ServedModel) -> Engine:
        """An engine whose caller starts it (an in-process app's start-up task): its `start` is charged as a model
        load too, timed where it is awaited (the reference engine loads its weights on a worker thread of its own)."""
        engine = self.build(served)
        start, split = engine.start, self.split

        async def measured_start() -> None:
            with split.phase("model loads"):
                await start()

        try:
            engine.start = measured_start  # type: ignore[method-assign]
        except AttributeError:  # an engine that takes no attributes starts unmeasured: its start counts as "other"
            pass
        return engine

    def build(self, served: ServedModel) -> Engine:
        """A new engine for `served`; a vllm manifest whose server already runs gets an engine over it."""
        with self.split.phase("model loads"):
            return self._build(served)

    def _build(self, served: ServedModel) -> Engine:
        llamacpp = served.runtime.backend == "llamacpp"
        if not (served.runtime.starts_vllm or llamacpp) or self._factory is not default_engine_factory:
            return self._factory(served)
        if llamacpp:
            from servegate.runtime.remote.llamacpp_backend import attach, launch_key
        else:
            from servegate.runtime.remote.vllm_backend import attach, launch_key  # type: ignore[assignment]

        key = served.runtime.backend + launch_key(served)
        running = self._vllm.get(key)
        if running is not None:
            from servegate.contracts.loading import load_fallback
            from servegate.runtime import build

            backup = load_fallback(served)
            fallback = build(backup, fallback=False) if backup is not None else None
            return attach(served, running, fallback)  # type: ignore[arg-type]  # _vllm holds only vLLM launches
        engine = self._factory(served)
        self._vllm[key] = engine
        return engine

    def get(self, served: ServedModel, tag: str = "") -> Engine:
        """The shared engine for `served`; a distinct `tag` gets a fresh one (e.g. a cold cache)."""
        key = (served.fingerprint, tag)
        if key not in self._engines:
            self._engines[key] = self.fresh(served)
        return self._engines[key]

    def fresh(self, served: ServedModel) -> Engine:
        """A new engine that no one else uses (closed with the pool)."""
        with self.split.phase("model loads"):
            engine = self.build(served)
            engine.start_sync()
        self.built += 1
        self._engines[(served.fingerprint, f"fresh-{self.built}")] = engine
        return engine

    def close(self) -> None:
        """Shut every engine down (errors while closing are ignored: the results are already in)."""
        owned = list(self._engines.values())
        owned += [e for e in self._vllm.values() if all(e is not o for o in owned)]
        self._vllm.clear()
        for engine in owned:
            try:
                engine.shutdown_sync()
            except Exception:  # noqa: S110 - shutdown failures must not hide the verdicts
                pass
        self._engines.clear()


class ProgressHook:
    """Receives progress from gates; the CLI forwards it to a rich progress bar."""

    def start(self, description: str, total: int) -> None:
        """A new piece of work with `total` steps."""

    def advance(self, steps: int = 1) -> None:
        """`steps` more done."""

    def lane(self, label: str) -> ProgressHook:
        """A hook for work that runs beside this hook's (the gates of a worker process), shown apart from it and
        named `label`; one that shows nothing here."""
        return ProgressHook()


def quiet_libraries() -> None:
    """Silence the progress bars and warnings of datasets and transformers: our own progress bar is the one shown."""
    import datasets
    from transformers.utils import logging as hf_logging

    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@dataclass
class CheckResources:
    """What the framework owns for one check and lends every gate of it: the engine pool (closed when the check
    ends), the disk cache of baseline outputs, the suite loader, and the suites loaded and run so far."""

    engines: EnginePool = field(default_factory=EnginePool)
    cache: OutputCache = field(default_factory=OutputCache)
    suite_loader: Callable[[ServedModel, Any], SuiteData] = load_any_suite
    suites: dict[tuple[str, str], SuiteData] = field(default_factory=dict)
    """Loaded suites by (name, declaration as JSON)."""
    runs: dict[tuple[str, str], SuiteRun] = field(default_factory=dict)
    """Whole-suite runs by (manifest fingerprint, suite digest), shared by the gates that compare the same runs."""
    split: TimeSplit = field(default_factory=TimeSplit)
    """Where the check's time goes, per gate and kind (`gate check --profile-gates`); the pool charges to it."""

    def __post_init__(self) -> None:
        self.engines.split = self.split


@dataclass
class GateContext:
    """What a gate reads: the manifests compared, why it runs, the candidate remote's identity and where its
    progress goes. Engines and suites come through `engines`, `suites` and `run_suite`, over the check's
    `resources`, which the framework owns (a gate keeps what it prepares on itself: Gate.prepare)."""

    baseline: ServedModel
    candidate: ServedModel
    mode: Literal["reference", "change"] = "reference"
    changed_paths: list[str] = field(default_factory=list)
    """The changed fields that made the current gate run (empty when it was forced with --gate)."""
    forced: bool = False
    """Whether the current gate runs because --gate named it."""
    reference: ServedModel | None = None
    """The reference form as declared (batching `none`); `baseline` may run it batched (see check.py)."""
    progress: ProgressHook = field(default_factory=ProgressHook)
    remote: Any = None
    """The candidate's remote as it identified itself (RemoteIdentity), for an endpoint candidate."""
    resources: CheckResources = field(default_factory=CheckResources)
    """The framework's: engines, output cache and suites of the whole check."""

    @property
    def engines(self) -> EnginePool:
        """The check's engine pool: `engines.get(served)` is a manifest's shared, started engine."""
        return self.resources.engines

    @property
    def split(self) -> TimeSplit:
        """The check's time split: `with ctx.split.phase("bench"):` charges a block to the current gate's bench."""
        return self.resources.split

    # --- manifests ------------------------------------------------------------------------------

    @property
    def unbatched(self) -> ServedModel:
        """The baseline run one request at a time: what every batching mode must reproduce."""
        reference = self.reference or self.baseline
        if reference.batching.mode == "none":
            return reference
        return reference.with_changes(batching={"mode": "none", "max_batch_size": 1})

    def isolated(self, paths: Iterable[str], source: ServedModel | None = None) -> ServedModel:
        """The baseline with the values at `paths` (dotted) taken from the candidate (or `source`).

        A remote candidate is returned whole: a remote cannot run the baseline with one field changed, so
        the gate measures the deployment as it is (and says so: `timed` marks the result).
        """
        if (source or self.candidate).runtime.remote:
            return source or self.candidate
        donor = (source or self.candidate).model_dump(mode="python")
        data = self.baseline.model_dump(mode="python")
        for path in paths:
            parts = path.split(".")
            src: Any = donor
            dst: Any = data
            for part in parts[:-1]:
                src = src.get(part) if isinstance(src, dict) else None
                if src is None:  # the donor has no such section (no kv_cache): nothing of it to take
                    break
                if not isinstance(dst.get(part), dict):
                    dst[part] = {}
                dst = dst[part]
            else:
                dst[parts[-1]] = src.get(parts[-1]) if isinstance(src, dict) else None
        try:
            built = ServedModel.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            raise GateSetupError(f"cannot isolate {', '.join(paths)} on the baseline: {first['msg']}") from None
        built._source = (source or self.candidate)._source
        built._path_bases = {**self.baseline._path_bases, **(source or self.candidate)._path_bases}
        return built

    # --- suites ---------------------------------------------------------------------------------

    def suites(self, served: ServedModel | None = None) -> list[SuiteData]:
        """The candidate's declared suites, loaded once per check."""
        served = served or self.candidate
        loaded = self.resources.suites
        out = []
        for suite in served.quality.suites:
            key = (suite.name, suite.model_dump_json())
            if key not in loaded:
                loaded[key] = self.resources.suite_loader(served, suite)
            out.append(loaded[key])
        return out

    def run_suite(
        self,
        served: ServedModel,
        data: SuiteData,
        *,
        role: Literal["baseline", "candidate"],
        items: Sequence[SuiteItem] | None = None,
        engine: Engine | None = None,
    ) -> SuiteRun:
        """Outputs and scores of `served` on a suite; baseline-role full-suite runs use the disk cache."""
        whole = items is None
        key = (served.fingerprint, data.digest)
        runs, cache = self.resources.runs, self.resources.cache
        if whole and key in runs:
            return runs[key]
        outputs: list[ItemOutput] | None = None
        chosen = list(data.items if items is None else items)
        cacheable = whole and role == "baseline"
        ckey = cache_key(served) if cacheable else ""
        if cacheable:
            outputs = cache.load(ckey, data)
        from_cache = outputs is not None
        if outputs is None:
            self.progress.start(f"{data.name}: {role} ({served.name})", len(chosen))
            with self.split.phase("reference outputs" if role == "baseline" else "candidate outputs"):
                outputs = run_any_items(engine or self.engines.get(served), data, chosen, self.progress.advance)
            check_available(served, data.name, outputs)
            if cacheable:
                cache.store(ckey, data, outputs)
        tools = served.postprocess.tools
        scores = score_run(data, outputs, chosen, tools.parser if tools is not None else None)
        run = SuiteRun(data, outputs, scores, from_cache=from_cache)
        if whole:
            runs[key] = run
        return run


class Gate:
    """A release gate. Subclasses are registered with `@register_gate(name, watches=..., purpose=...)`."""

    name: ClassVar[str] = ""
    watches: ClassVar[tuple[str, ...]] = ()
    """Manifest field prefixes whose change makes this gate relevant."""
    purpose: ClassVar[str] = ""
    """One line: what the gate protects users from."""

    def prepare(self, ctx: GateContext) -> None:
        """Start slow set-up before the gates run (e.g. a server process), keeping it on the gate itself, in
        attributes of its own types: the check builds each gate once, so the same object prepares and runs.

        Called for every gate that will run, before the first one does, so a gate's start-up overlaps
        the gates ahead of it; `release` stops what run did not take.
        """

    def release(self) -> None:
        """Stop what `prepare` started and `run` did not take; called once when the check ends, whatever
        happened (a gate that prepares nothing has nothing to release)."""

    def run(self, ctx: GateContext) -> GateResult:
        """Compare and return a verdict with measurements and public-safe evidence."""
        raise NotImplementedError

    def result(
        self,
        verdict: Verdict,
        reason: str,
        measurements: AnyMeasurements | None = None,
        evidence: list[dict[str, Any]] | None = None,
    ) -> GateResult:
        """A result carrying this gate's name."""
        if measurements is None:
            return GateResult(self.name, verdict, reason, evidence=evidence or [])
        return GateResult(self.name, verdict, reason, measurements, evidence or [])


def check_available(served: ServedModel, suite: str, outputs: Sequence[ItemOutput]) -> None:
    """Raise RemoteUnavailable when more of a run's requests ended model_unavailable than the manifest allows."""
    lost = [o for o in outputs if o.error == "model_unavailable"]
    if not outputs or not lost:
        return
    share = len(lost) / len(outputs)
    if share > served.quality.max_unavailable_share:
        where = served.runtime.endpoint_url if served.runtime.remote else "the engine"
        raise RemoteUnavailable(
            f"{suite}: {len(lost)} of {len(outputs)} requests to {where} ended model_unavailable "
            f"({share:.0%} > quality.max_unavailable_share {served.quality.max_unavailable_share:.0%}): "
            "nothing was measured"
        )


def timed(gate: Gate, ctx: GateContext) -> GateResult:
    """Run a gate, timing it; setup errors become a failing result that names the problem, an engine that
    cannot be reached an `unavailable` one; a result measured on a remote says so."""
    began = time.perf_counter()
    try:
        result = gate.run(ctx)
    except GateSetupError as exc:
        result = gate.result("fail", f"could not run: {exc}")
    except RemoteUnavailable as exc:
        result = gate.result("unavailable", str(exc))
    if ctx.candidate.runtime.remote and result.verdict not in ("skipped", "unavailable"):
        if result.measurements.ran_on is None:
            result.measurements = labelled(result.measurements, remote_label(ctx))
    result.duration_s = round(time.perf_counter() - began, 3)
    return result


def remote_label(ctx: GateContext) -> str:
    """Where a remote candidate ran, as reports name it: engine, version, model and URL."""
    rt = ctx.candidate.runtime
    who = "endpoint"
    if ctx.remote is not None:
        who = f"{ctx.remote.engine} {ctx.remote.version or '(version not reported)'}"
    where = f"at {rt.endpoint_url}" if rt.endpoint_url else "started by servegate from the manifest"
    return f"{who} serving {rt.endpoint_model or ctx.candidate.name} {where} (measured whole, as deployed)"
