"""What `gate check` and `gate note` can know before any work: the files they will write and read, the gates named.

Each check here is decided by the command line and the manifest alone, so a path that cannot be written, a
card without a name or a suite line that is not JSON costs a second instead of a model load and every gate.
All problems are gathered and raised together: one line each, exit 2 (see cli/app.py).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel

EXAMPLE_NAMES = {
    "--json": "report.json",
    "--junit": "gates.xml",
    "--markdown": "gates.md",
    "--note": "SERVING.md",
    "-o": "SERVING.md",
    "--model-card": "README.md",
}
"""A file name to suggest per option when the path given is a folder."""


def _nearest_existing(path: Path) -> Path:
    """`path`'s closest ancestor that exists (write_atomic creates the missing folders below it)."""
    here = path.parent
    while not here.exists() and here != here.parent:
        here = here.parent
    return here


def output_problem(option: str, target: str | Path | None) -> str | None:
    """Why the file `option` names could not be written, or None when it can be (or is stdout, '-')."""
    if target is None or str(target) == "-":
        return None
    path = Path(target)
    if path.is_dir():
        example = path / EXAMPLE_NAMES.get(option.split()[0], "out.txt")
        return f"{option} {path}: is a folder, not a file: give a file path, e.g. {example}"
    folder = _nearest_existing(path.absolute())
    if not folder.is_dir():
        return f"{option} {path}: {folder} is a file, so no folder can be made there: choose another path"
    try:  # a real probe: permission bits say nothing for root, and nothing about a read-only file system
        handle, probe = tempfile.mkstemp(prefix=".servegate-probe-", dir=folder)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        return f"{option} {path}: cannot write in {folder} ({exc.strerror or exc}): choose a writable path"
    return None


def output_problems(outputs: Mapping[str, str | Path | None]) -> list[str]:
    """One line per output (option -> path) that cannot be written, or that another output would overwrite."""
    problems = [p for option, target in outputs.items() if (p := output_problem(option, target)) is not None]
    seen: dict[Path, str] = {}
    for option, target in outputs.items():
        if target is None or str(target) == "-":
            continue
        resolved = Path(target).absolute().resolve()
        if resolved in seen:
            problems.append(f"{option} {target}: {seen[resolved]} writes the same file: give the two different paths")
        seen.setdefault(resolved, option)
    return problems


def jsonl_problem(served: ServedModel, index: int) -> str | None:
    """For a suite read from a local JSONL file: the first line that is not a JSON object, named with its number."""
    suite = served.quality.suites[index]
    if suite.lm_eval is not None or suite.dataset.startswith(("zoo:", "hf:")):
        return None
    path = served.resolve_path(suite.dataset)
    if path.suffix.lower() != ".jsonl" or not path.is_file():
        return None  # a zoo name, another format, or a missing file: the suite loader says which
    field = f"quality.suites[{suite.name}].dataset"
    try:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    return f"{field}: {path} line {number} is not JSON ({exc.msg}, column {exc.colno}): fix that line"
                if not isinstance(row, dict):
                    return f"{field}: {path} line {number} is not a JSON object: write one object per line"
    except (OSError, UnicodeDecodeError) as exc:
        return f"{field}: cannot read {path} ({exc}): fix the file or the path"
    return None


def checkpoint_problems(baseline: ServedModel, candidate: ServedModel) -> list[str]:
    """What the files of a toolchain checkpoint say before any model loads: a scheme, format or GGUF type the
    runtime cannot run, a missing file, or a candidate whose architecture is not its parent's."""
    from servegate.runtime.model.checkpoint_scheme import architecture_of, architecture_problems, read_scheme
    from servegate.runtime.model.weights import resolve_weights_dir

    problems: list[str] = []
    folders: dict[str, Path] = {}
    if not (baseline.weights.quantized_checkpoint or candidate.weights.quantized_checkpoint):
        return problems  # plain weights: the loader checks them
    for side, served in (("baseline", baseline), ("candidate", candidate)):
        weights = served.weights
        if weights.source.startswith("hf:"):
            continue  # resolving it downloads; the loader reports what is wrong with it
        try:
            folders[side] = resolve_weights_dir(served)
            read_scheme(folders[side], weights.format, weights.gguf_file)
        except ServegateError as exc:
            problems.append(f"{side} weights ({weights.source}): {exc}")
            folders.pop(side, None)
    problems += gguf_parent_problems(candidate)
    if problems or len(folders) < 2 or not candidate.weights.quantized_checkpoint:
        return problems
    if baseline.weights.model_dump() == candidate.weights.model_dump():
        return problems
    try:
        parent = architecture_of(folders["baseline"], baseline.weights.format, baseline.weights.gguf_file)
        built = architecture_of(folders["candidate"], candidate.weights.format, candidate.weights.gguf_file)
    except (ServegateError, OSError, ValueError, KeyError) as exc:
        return [f"cannot read the checkpoints' architectures: {exc}"]
    problems = architecture_problems(parent, built, f"candidate weights {candidate.weights.source}")
    return problems or tokenizer_problems(baseline, candidate)


def gguf_parent_problems(candidate: ServedModel) -> list[str]:
    """A GGUF that `weights.derived_from` names as the parent must hold plain floats (F16, BF16, F32), which
    only its header tells (the manifest loader accepts any GGUF parent for that reason)."""
    from servegate.runtime.model.checkpoint_scheme import read_scheme
    from servegate.runtime.model.weights import resolve_weights_dir

    if not candidate.weights.derived_from_manifest:
        return []
    parent = candidate.with_parent_weights()
    weights = parent.weights
    if weights.format != "gguf" or weights.source.startswith("hf:"):
        return []
    try:
        scheme = read_scheme(resolve_weights_dir(parent), "gguf", weights.gguf_file)
    except ServegateError as exc:
        return [f"weights.derived_from {candidate.weights.derived_from}: {exc}"]
    if not scheme.quantized:
        return []
    return [
        f"weights.derived_from {candidate.weights.derived_from}: its GGUF is {scheme.scheme}, already quantized: "
        "name the unquantized (F16, BF16 or F32) GGUF or the safetensors the build was made from"
    ]


def tokenizer_problems(baseline: ServedModel, candidate: ServedModel) -> list[str]:
    """A quantized build must keep its parent's tokenizer: the same vocabulary, token for token."""
    from servegate.runtime.model.weights import load_tokenizer

    parent, built = load_tokenizer(baseline).get_vocab(), load_tokenizer(candidate).get_vocab()
    if parent == built:
        return []
    differ = sorted(set(parent.items()) ^ set(built.items()), key=str)
    return [
        f"candidate weights {candidate.weights.source}: its tokenizer differs from the parent's ({len(built)} "
        f"against {len(parent)} tokens; {len(differ)} token ids differ, e.g. {differ[0][0]!r}): a quantized build "
        "keeps its parent's tokenizer; point weights.derived_from (or --baseline) at the model it was made from"
    ]


def gate_problems(forced: Sequence[str]) -> list[str]:
    """One line per --gate name no registered gate has, with the closest name ("did you mean ...?")."""
    from servegate.gates.registry import GATES, RegistryError

    problems = []
    for name in dict.fromkeys(forced):
        try:
            GATES.entry(name)
        except RegistryError as exc:
            problems.append(f"--gate {name}: {exc}")
    return problems


def raise_problems(problems: Sequence[str]) -> None:
    """Raise every problem found at once (one line each), or nothing when there are none."""
    if problems:
        raise ServegateError("\n".join(problems))


def check_before_gating(
    baseline: ServedModel,
    candidate: ServedModel,
    *,
    mode: Literal["reference", "change"],
    forced: Sequence[str],
    outputs: Mapping[str, str | Path | None],
    note: Path | None,
) -> None:
    """Everything `gate check` can know before its first gate; a ServegateError naming each problem.

    `baseline` is the reference form in reference mode. Checked: the --gate names, that every output can
    be written (and no two are one file), the note's manifest-only items when --note is given, and that
    every local JSONL suite parses. The suite loader itself still runs before any engine (gates/check.py).
    """
    from servegate.gates.check import plan_gates
    from servegate.gates.registry import GATES

    problems = gate_problems(forced)
    planned = plan_gates(baseline, candidate, mode=mode, forced=[name for name in forced if name in GATES])
    files = dict(outputs)
    note_lines: list[str] = []
    if note is not None:
        from servegate.model_cards.evidence import NoteError
        from servegate.model_cards.note import manifest_problems, twin_path
        from servegate.model_cards.note_files import check_note_path

        try:
            check_note_path(note)
        except NoteError as exc:
            note_lines.append(f"--note {note}: {exc}")
        files.update({"--note": note, "--note (its JSON twin)": twin_path(note)})
        capacity_runs = any(p.name == "capacity" and p.run for p in planned)
        note_lines += manifest_problems(candidate, capacity_gate_runs=capacity_runs)
    problems += output_problems(files) + note_lines + checkpoint_problems(baseline, candidate)
    if any(p.run for p in planned):
        problems += [p for i in range(len(candidate.quality.suites)) if (p := jsonl_problem(candidate, i))]
    raise_problems(problems)
