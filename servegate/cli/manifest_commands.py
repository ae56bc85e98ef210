"""Manifest commands: `gate validate`, `gate schema`, `gate fingerprint`, `gate diff`."""

from __future__ import annotations

import json
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from servegate.cli.common import JsonOption, SetOption, baseline_file, console_for, load, write_json
from servegate.cli.tables import print_table
from servegate.contracts.diff import diff_report
from servegate.contracts.errors import ServegateError
from servegate.contracts.git_revision import GitBaseline, is_git_spec
from servegate.contracts.manifest import ServedModel
from servegate.contracts.remote_scope import remote_scope
from servegate.contracts.schema import manifest_json_schema
from servegate.contracts.structured_section import StructuredOutput
from servegate.contracts.tools_section import ToolCalling
from servegate.contracts.units import format_bytes
from servegate.gates.registry import gate_watches

if TYPE_CHECKING:
    from servegate.runtime.model.checkpoint_scheme import CheckpointScheme


def _constraints(structured: StructuredOutput | None) -> str:
    """The output constraints a manifest serves, for the summary ('' when none)."""
    if structured is None:
        return ""
    mask = f"{structured.backend} mask, JSON whitespace {structured.whitespace}"
    forced = "output_schema decoded on every request" if structured.enforce_output_schema else ""
    if not structured.request_constraints:
        return f"{forced} ({mask}); "
    kinds = f"output constraints from requests: {', '.join(structured.kinds)} up to {structured.max_spec_bytes} bytes"
    return f"{kinds} ({mask}){'; ' + forced if forced else ''}; "


def _tool_summary(tools: ToolCalling | None) -> str:
    """The tool calling a manifest serves, for the summary ('' when none)."""
    if tools is None:
        return ""
    return f"tool calls: tool_choice {', '.join(tools.tool_choice)}, read by the {tools.parser} parser; "


def _explain(served: ServedModel) -> list[tuple[str, str]]:
    """One plain-language line per element: what this manifest serves and how."""
    w, pre, rt, bat, post, fail = (
        served.weights,
        served.preprocess,
        served.runtime,
        served.batching,
        served.postprocess,
        served.failure_policy,
    )
    kv = rt.kv_cache
    kv_text = (
        f"paged KV cache, {format_bytes(kv.memory_budget)} in blocks of {kv.block_size} tokens"
        f"{', prefix caching (' + kv.cache_scope + ' scope)' if kv.prefix_caching else ''}"
        if kv
        else "no paged KV cache"
    )
    fallback = (
        f"fallback {fail.fallback.manifest} on {', '.join(fail.fallback.triggers)}" if fail.fallback else "no fallback"
    )
    checksums = f"{len(w.sha256)} file checksum(s) verified" if w.sha256 else "no checksums declared"
    return [
        ("weights", f"{w.source} ({w.format}, dtype {w.dtype}); {checksums}"),
        (
            "preprocess",
            f"task {pre.task}; at most {pre.max_input_tokens} input tokens and {pre.max_payload_bytes} bytes; "
            f"over-long prompts: {pre.truncation}; tenant from {pre.tenant_from}",
        ),
        (
            "runtime",
            f"{rt.backend} backend on {rt.device} ({rt.dtype}); max_model_len {rt.max_model_len} tokens; "
            f"quantization {rt.quantization.method}; {kv_text}",
        ),
        (
            "batching",
            f"{bat.mode}; up to {bat.max_batch_size} sequences, {bat.max_wait_ms} ms wait, "
            f"{bat.max_num_batched_tokens} tokens/step{', chunked prefill' if bat.chunked_prefill else ''}",
        ),
        (
            "postprocess",
            f"at most {post.max_output_tokens} output tokens; "
            f"{'output JSON Schema enforced' if post.output_schema else 'free text'}; "
            f"{_constraints(post.structured_output)}"
            f"{_tool_summary(post.tools)}"
            f"response cache {'on (' + post.response_cache.scope + ')' if post.response_cache.enabled else 'off'}",
        ),
        (
            "failure_policy",
            f"deadline {fail.request_timeout_s} s; queue {fail.max_queue}; overload -> {fail.overload} "
            f"({fail.overload_status}, Retry-After {fail.retry_after_s} s); {fallback}",
        ),
        ("quality", f"{len(served.quality.suites)} suite(s): " + ", ".join(s.name for s in served.quality.suites)),
    ]


def validate(
    manifests: Annotated[list[Path], typer.Argument(help="Manifest file(s) (YAML or JSON).", show_default=False)],
    set_: SetOption = None,
    json_out: JsonOption = None,
    manifests_only: Annotated[
        bool,
        typer.Option("--manifests-only", help="Skip files that are not manifests (the pre-commit hook's mode)."),
    ] = False,
) -> None:
    """Validate manifests and explain what each serves (exit 2 when one is invalid).

    With several files every one is validated and each problem printed. --manifests-only skips, with a line each,
    the files that are not servegate manifests: no kind: ServedModel, apiVersion: servegate/..., weights.source
    or include: of a manifest (docs/ci.md, pre-commit hooks).

    Examples:
      gate validate examples/quickstart/manifest.yaml --set batching.mode=continuous
      gate validate --manifests-only examples/quickstart/*.yaml .gitlab-ci.yml
    """
    if len(manifests) == 1 and not manifests_only:
        write_json(json_out, validate_one(manifests[0], set_, console_for(json_out)))
        return
    from servegate.cli.manifest_hooks import validate_files

    validate_files(manifests, set_, json_out, manifests_only=manifests_only, validate_one=validate_one)


def validate_one(manifest: Path, set_: list[str] | None, console: Console) -> dict[str, Any]:
    """Validate one manifest, print what it serves, and return the JSON result (a ManifestError when invalid)."""
    from servegate.runtime.model.weights import served_scheme

    served = load(manifest, set_)
    residuals = _vllm_residuals(served)
    scheme = served_scheme(served)
    table = Table(title=f"{served.name} {served.version}: valid", show_header=True)
    table.add_column("element")
    table.add_column("declared")
    for element, text in _explain(served):
        table.add_row(element, text)
    print_table(console, table)
    scope = remote_scope(served)
    if scope is not None:
        print_table(console, _scope_table(served, scope))
    for line in residuals:
        console.print(f"note: {line}")
    for line in _checkpoint_lines(served, scheme):
        console.print(line)
    console.print(f"fingerprint {served.fingerprint}")
    if not served.weights.sha256:
        console.print("note: weights.sha256 is empty, so the fingerprint cannot tell two checkpoints apart")
    payload: dict[str, Any] = {"valid": True, "name": served.name, "fingerprint": served.fingerprint}
    if scope is not None:
        payload["remote_scope"] = scope
    if scheme is not None:
        payload["checkpoint"] = asdict(scheme)
    return payload


def _checkpoint_lines(served: ServedModel, scheme: CheckpointScheme | None) -> list[str]:
    """What `gate validate` says of a toolchain checkpoint: its scheme, how it runs, and its parent."""
    if not served.weights.quantized_checkpoint:
        return []
    if scheme is None:
        return [f"note: {served.weights.source} is read when it is downloaded; its scheme is checked at load"]
    lines = [f"checkpoint: {scheme.summary()}", f"runs as: {scheme.executed_as}"]
    parent = served.weights.derived_from
    if parent is None:
        lines.append(
            "note: no weights.derived_from, so `gate check` compares this checkpoint with itself: name the "
            "unquantized parent it was made from (a manifest or a weights source)"
        )
    else:
        lines.append(f"parent: {parent} (gate check compares the checkpoint with it)")
    return lines


def _vllm_residuals(served: ServedModel) -> list[str]:
    """For backend: vllm or llamacpp, what the engine leaves to others (an error when it would serve a field
    differently)."""
    if served.runtime.backend == "llamacpp":
        from servegate.runtime.remote.llamacpp_backend import gguf_of, llamacpp_arguments

        mapped = llamacpp_arguments(served, *gguf_of(served))  # raises, naming each field llama.cpp would change
        return [f"{r.field}: {r.reason} (enforced by {r.enforced_by})" for r in mapped.residuals]
    if not served.runtime.starts_vllm:
        return []
    from servegate.runtime.remote.vllm_backend import vllm_arguments

    args = vllm_arguments(served, served.weights.source)  # raises, naming each field vLLM would change
    return [f"{r.field}: {r.reason} (enforced by {r.enforced_by})" for r in args.residuals]


def _scope_table(served: ServedModel, scope: dict[str, Any]) -> Table:
    """For an endpoint manifest: which fields servegate enforces in front, verifies, or only repeats."""
    where = served.runtime.endpoint_url or "started by servegate"
    table = Table(title=f"{served.runtime.backend} ({where}): who holds each field")
    table.add_column("field")
    table.add_column("held by")
    for path, how in scope["enforced_in_front"].items():
        table.add_row(path, f"servegate, in front: {how}")
    for path, how in scope.get("set_at_launch", {}).items():
        table.add_row(path, f"set when servegate starts the server: {how}")
    for path, how in scope["verified_on_remote"].items():
        table.add_row(path, f"verified on the remote: {how}")
    recorded = "declared by the remote"
    if "set_at_launch" in scope:  # a server servegate started: these are what it has no setting for
        recorded = "recorded only: the engine has no setting for it"
    for path, value in scope["declared_not_verified"].items():
        table.add_row(path, f"{recorded}, not verified ({json.dumps(value)})")
    return table


def schema(
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write to a file instead of stdout.")] = None,
) -> None:
    """Print the JSON Schema of the manifest (for editors and CI validation)."""
    text = json.dumps(manifest_json_schema(), indent=2) + "\n"
    if output is None:
        typer.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")


def fingerprint(
    manifest: Annotated[Path | None, typer.Argument(help="Manifest file (YAML or JSON).", show_default=False)] = None,
    set_: SetOption = None,
    json_out: JsonOption = None,
    check: Annotated[
        Path | None,
        typer.Option("--check", help="Compare with the fingerprint committed in FILE; exit 1 when it differs."),
    ] = None,
    check_tracked: Annotated[
        bool,
        typer.Option("--check-tracked", help="Check every tracked NAME.fingerprint against NAME.yaml (pre-commit)."),
    ] = False,
) -> None:
    """Print the behaviour fingerprint: sha256 of the six elements plus weight checksums.

    --check FILE compares it with the one FILE records (what `gate fingerprint MANIFEST > FILE` wrote, or a
    `--json` result) and exits 1 when they differ, so a behaviour change cannot be committed unnoticed.

    Examples:
      gate fingerprint examples/quickstart/manifest.yaml > examples/quickstart/manifest.fingerprint
      gate fingerprint --check examples/quickstart/manifest.fingerprint examples/quickstart/manifest.yaml
      gate fingerprint --check-tracked    # every tracked NAME.fingerprint against NAME.yaml (.yml, .json) beside it
    """
    if check_tracked:
        from servegate.cli.manifest_hooks import check_tracked_fingerprints

        if manifest is not None or check is not None:
            raise ServegateError("--check-tracked finds the files and manifests: give neither MANIFEST nor --check")
        check_tracked_fingerprints(json_out)
        return
    if manifest is None:
        raise ServegateError("give the MANIFEST, or --check-tracked")
    served = load(manifest, set_)
    if check is not None:
        from servegate.cli.manifest_hooks import check_fingerprint

        check_fingerprint(served, manifest, check, json_out)
        return
    if json_out is None:
        typer.echo(served.fingerprint)
    else:
        console_for(json_out).print(served.fingerprint)
        write_json(json_out, {"name": served.name, "fingerprint": served.fingerprint})


def _value(value: Any) -> str:
    return "(absent)" if value is None else json.dumps(value)


def diff(
    a: Annotated[str, typer.Argument(help="Baseline manifest: a file, or git:REV[:PATH] (B's path at REV).")],
    b: Annotated[str, typer.Argument(help="Candidate manifest: a file, or git:REV[:PATH] (A's path at REV).")],
    set_: SetOption = None,
    json_out: JsonOption = None,
    exit_code: Annotated[
        bool, typer.Option("--exit-code", help="Exit 1 when the two serve different behaviour (fingerprints differ).")
    ] = False,
) -> None:
    """Show what changed between two manifests, per element, and which gates the change triggers.

    --set applies to the candidate. A side written git:REV[:PATH] is read from that revision (PATH relative to the
    repository root, defaulting to the other side's file), the working tree untouched.

    Examples:
      gate diff base.yaml candidate.yaml --json -
      gate diff git:origin/main examples/quickstart/manifest.yaml
    """
    with ExitStack() as files:
        path_a, git_a = files.enter_context(baseline_file(a, None if is_git_spec(b) else Path(b)))
        path_b, git_b = files.enter_context(baseline_file(b, None if is_git_spec(a) else Path(a)))
        _show_diff(load(path_a, None), load(path_b, set_), {"baseline": git_a, "candidate": git_b}, json_out, exit_code)


def _show_diff(
    baseline: ServedModel,
    candidate: ServedModel,
    from_git: dict[str, GitBaseline | None],
    json_out: str | None,
    exit_code: bool,
) -> None:
    from servegate.runtime.model.weights import served_scheme

    report = diff_report(baseline, candidate, gate_watches())
    console = console_for(json_out)
    for side, read in from_git.items():
        if read is not None:
            report[f"{side}_git"] = read.to_dict()
            console.print(f"{side}: {read.summary()}", highlight=False)
    if not report["changes"]:
        console.print("no differences")
    for element, changes in report["changes"].items():
        table = Table(title=element, show_header=True, title_justify="left")
        for column in ("field", "baseline", "candidate", "gates"):
            table.add_column(column)
        for change in changes:
            gates = ", ".join(change["gates"]) or "-"
            table.add_row(change["path"], _value(change["old"]), _value(change["new"]), gates)
        print_table(console, table)
    same = "same behaviour" if report["same_behaviour"] else "different behaviour"
    console.print(f"fingerprints: {baseline.fingerprint[:12]} -> {candidate.fingerprint[:12]} ({same})")
    schemes = {side: served_scheme(served) for side, served in (("baseline", baseline), ("candidate", candidate))}
    if any(schemes.values()):
        sides = [f"{served.weights.format} {s.scheme if s else ''}".strip() for served, s in
                 ((baseline, schemes["baseline"]), (candidate, schemes["candidate"]))]  # fmt: skip
        console.print(f"weights: {sides[0]} -> {sides[1]}")
        for side, scheme in schemes.items():
            if scheme is not None:
                console.print(f"  {side}: {scheme.summary()}")
        report["checkpoints"] = {side: asdict(s) for side, s in schemes.items() if s is not None}
    if report["gates"]:
        console.print("gates to run: " + ", ".join(f"{g} ({', '.join(p)})" for g, p in report["gates"].items()))
    write_json(json_out, report)
    if exit_code and not report["same_behaviour"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the manifest commands to the root app."""
    app.command("validate")(validate)
    app.command("schema")(schema)
    app.command("fingerprint")(fingerprint)
    app.command("diff")(diff)
