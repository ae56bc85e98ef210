"""Load a manifest from YAML or JSON: `include:` merging, `--set` overrides, located error messages.

Every problem is reported as `FILE:LINE:COL: field.path: what is wrong (got X)`, so a user can jump
straight to it. Positions are kept per field path while files are merged, so an error in a value that
came from an included base file points into that base file.
"""

from __future__ import annotations

import difflib
import io
import json
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError

from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.contracts.sections import Weights

Path_ = tuple[Any, ...]
Position = tuple[str, int, int]  # (origin, line, column), 1-based; line 0 for --set overrides


PATH_FIELDS: tuple[Path_, ...] = (
    ("weights", "source"),
    ("weights", "derived_from"),
    ("preprocess", "chat_template"),
    ("runtime", "quantization", "calibration"),
    ("failure_policy", "fallback", "manifest"),
    ("quality", "suites", int, "dataset"),
)
"""The fields that hold file paths (`int`: any list item); a relative one resolves against the file that wrote it."""


class Located:
    """Raw manifest data plus where each field path was written."""

    def __init__(
        self, data: dict[str, Any], positions: dict[Path_, Position], folders: dict[str, Path] | None = None
    ) -> None:
        self.data = data
        self.positions = positions
        self.folders = folders or {}
        """Origin (as positions name it) -> the folder of that file."""


def _plain(node: Any, origin: str, path: Path_, positions: dict[Path_, Position]) -> Any:
    """Convert a ruamel node to plain Python, recording the position of every key and list item."""
    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key in node:
            try:
                line, col = node.lc.key(key)
            except (KeyError, TypeError):  # keys merged in by `<<:` have no position: point at their mapping
                line, col = node.lc.line, node.lc.col
            positions[(*path, key)] = (origin, line + 1, col + 1)
            out[key] = _plain(node[key], origin, (*path, key), positions)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, item in enumerate(node):
            line, col = node.lc.item(i)
            positions[(*path, i)] = (origin, line + 1, col + 1)
            items.append(_plain(item, origin, (*path, i), positions))
        return items
    if hasattr(node, "value") and type(node).__module__.startswith("ruamel"):
        return node.value  # ruamel scalar wrappers (e.g. ScalarFloat keeps formatting)
    return node


def _parse_text(text: str, origin: str) -> Located:
    yaml = YAML(typ="rt")
    yaml.allow_duplicate_keys = False
    try:
        node = yaml.load(io.StringIO(text))
    except MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{origin}:{mark.line + 1}:{mark.column + 1}" if mark else origin
        problem = exc.problem or exc.context or "invalid YAML"
        raise ManifestError([f"{where}: {problem}"]) from None
    except Exception as exc:  # ruamel raises a few unmarked errors (e.g. duplicate keys in some forms)
        raise ManifestError([f"{origin}: cannot parse: {exc}"]) from None
    if node is None:
        raise ManifestError([f"{origin}:1:1: the manifest is empty: expected apiVersion, name, weights, ..."])
    if not isinstance(node, CommentedMap):
        raise ManifestError([f"{origin}:1:1: the manifest must be a mapping of sections (got {type(node).__name__})"])
    positions: dict[Path_, Position] = {}
    return Located(_plain(node, origin, (), positions), positions)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Merge `over` onto `base`: mappings merge key by key, anything else in `over` replaces."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_located(path: Path, _stack: tuple[Path, ...] = ()) -> Located:
    """Read one manifest file and everything it includes, merged, with positions."""
    resolved = path.resolve()
    if resolved in _stack:
        chain = " -> ".join(_display(p) for p in (*_stack, resolved))
        raise ManifestError([f"{_display(_stack[-1])}: include cycle: {chain}"])
    origin = _display(path)
    if not path.is_file():
        raise ManifestError([f"{origin}: file not found"])
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ManifestError([f"{origin}: not UTF-8 text ({exc.reason} at byte {exc.start})"]) from None
    located = _parse_text(text, origin)
    located.folders[origin] = resolved.parent
    include = located.data.pop("include", None)
    if include is None:
        return located
    includes = [include] if isinstance(include, str) else include
    if not isinstance(includes, list) or not all(isinstance(i, str) and i and "\0" not in i for i in includes):
        line, col = located.positions[("include",)][1:]
        raise ManifestError([f"{origin}:{line}:{col}: include: must be a file path or a list of paths"])
    merged: dict[str, Any] = {}
    positions: dict[Path_, Position] = {}
    folders = dict(located.folders)
    for name in includes:
        base = read_located(path.parent / name, (*_stack, resolved))
        merged = deep_merge(merged, base.data)
        positions.update(base.positions)
        folders.update(base.folders)
    located.positions.pop(("include",), None)
    positions.update(located.positions)
    return Located(deep_merge(merged, located.data), positions, folders)


def _path_values(data: Any, pattern: Path_, at: Path_ = ()) -> Iterable[tuple[Path_, Any]]:
    """(field path, value) of every field matching `pattern` (`int` matches any list index)."""
    if not pattern:
        yield at, data
        return
    head, rest = pattern[0], pattern[1:]
    if head is int and isinstance(data, list):
        for i, item in enumerate(data):
            yield from _path_values(item, rest, (*at, i))
    elif isinstance(head, str) and isinstance(data, dict) and head in data:
        yield from _path_values(data[head], rest, (*at, head))


def _not_relative(value: str) -> bool:
    """An absolute path, or a name with a scheme (`zoo:arith`, `hf:org/name`) that no folder changes."""
    return Path(value).expanduser().is_absolute() or re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", value) is not None


def path_bases(located: Located, own_folder: Path) -> dict[str, Path]:
    """Relative paths written in an included file of another folder -> that folder (what resolve_path needs).

    A path keeps the text it was written with (so the fingerprint of a variant that changes nothing is its
    base's); only where it resolves to follows the file that declared it, as in docker compose and kustomize.
    """
    bases: dict[str, Path] = {}
    written: dict[str, Path_] = {}
    for pattern in PATH_FIELDS:
        for field, value in _path_values(located.data, pattern):
            position = located.positions.get(field)
            folder = located.folders.get(position[0]) if position is not None else None
            if not isinstance(value, str) or folder is None or _not_relative(value):
                continue
            if value in written and bases.get(value, own_folder) != folder:
                other = ".".join(map(str, written[value]))
                message = (
                    f"the relative path {value!r} is also written at {other} in a file of another folder, so it "
                    "would resolve to two places: write one of them as an absolute path"
                )
                # position is not None here: folder was found from it
                raise ManifestError([_format(position, field, message)])  # type: ignore[arg-type]
            written[value] = field
            if folder != own_folder:
                bases[value] = folder
    return bases


# --- --set PATH=VALUE ------------------------------------------------------------------------------


def parse_set(expr: str) -> tuple[list[str], Any]:
    """Parse one `--set PATH=VALUE` (VALUE read as a YAML scalar or flow value: 3, true, [a, b], {k: v})."""
    if "=" not in expr:
        raise ServegateError(f"--set {expr}: expected PATH=VALUE, e.g. --set batching.mode=continuous")
    key, raw = expr.split("=", 1)
    parts = key.strip().split(".")
    if not key.strip() or any(not p or not re.match(r"^[A-Za-z0-9_-]+$", p) for p in parts):
        raise ServegateError(f"--set {expr}: PATH must be dotted field names, e.g. runtime.kv_cache.block_size")
    try:
        value = YAML(typ="safe").load(raw) if raw.strip() else ""
    except Exception as exc:
        raise ServegateError(f"--set {expr}: VALUE is not valid YAML: {exc}") from None
    return parts, value


def apply_set(located: Located, expr: str) -> None:
    """Apply one `--set PATH=VALUE` to the raw data, recording `--set` as the value's origin."""
    parts, value = parse_set(expr)
    node: Any = located.data
    path: Path_ = ()
    for i, part in enumerate(parts):
        key: Any = int(part) if isinstance(node, list) and part.isdigit() else part
        last = i == len(parts) - 1
        if isinstance(node, list):
            if not isinstance(key, int) or key >= len(node):
                raise ServegateError(f"--set {expr}: {'.'.join(parts[: i + 1])}: no such list item")
        elif not isinstance(node, dict):
            raise ServegateError(f"--set {expr}: {'.'.join(parts[:i])} is not a mapping")
        path = (*path, key)
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and not isinstance(node.get(key), (dict, list)):
                node[key] = {}
            node = node[key]
    for known in [p for p in located.positions if p[: len(path)] == path]:
        del located.positions[known]
    located.positions[path] = (f"--set {expr}", 0, 0)


# --- validation errors -> located messages ---------------------------------------------------------


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _fields_at(loc: Path_) -> list[str]:
    """Field names allowed at `loc` (a path of keys and list indexes from the manifest root)."""
    model: type[BaseModel] | None = ServedModel
    for part in loc:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part)
        model = _model_in(field.annotation) if field is not None else None
    return sorted(model.model_fields) if model is not None else []


def _got(value: Any) -> str:
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value, default=str)
    except (TypeError, ValueError):  # mappings with non-string keys (YAML complex keys)
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(error: ErrorDetails) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    loc = error["loc"]
    simple = {
        "missing": "required field is missing",
        "int_type": f"must be an integer (got {_got(value)})",
        "int_parsing": f"must be an integer (got {_got(value)})",
        "int_from_float": f"must be a whole number (got {_got(value)})",
        "float_type": f"must be a number (got {_got(value)})",
        "float_parsing": f"must be a number (got {_got(value)})",
        "bool_type": f"must be true or false (got {_got(value)})",
        "bool_parsing": f"must be true or false (got {_got(value)})",
        "string_type": f"must be a string (got {_got(value)})",
        "dict_type": f"must be a mapping (got {_got(value)})",
        "model_type": f"must be a mapping of fields (got {_got(value)})",
        "model_attributes_type": f"must be a mapping of fields (got {_got(value)})",
        "list_type": f"must be a list (got {_got(value)})",
    }
    if kind in simple:
        return simple[kind]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        hint = difflib.get_close_matches(str(loc[-1]), allowed, n=1, cutoff=0.6)
        tail = f"; did you mean '{hint[0]}'?" if hint else f"; allowed keys: {', '.join(allowed)}"
        return f"unknown key '{loc[-1]}'{tail}"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        if isinstance(limit, float) and limit.is_integer():
            limit = int(limit)
        return f"must be {bounds[kind]} {limit} (got {_got(value)})"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')} (got {_got(value)})"
    if kind == "string_too_short":
        return "must not be empty" if ctx.get("min_length") == 1 else f"needs >= {ctx.get('min_length')} characters"
    if kind == "string_too_long":
        return f"must have at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')} (got {_got(value)})"
    if kind == "too_short":
        return f"needs at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{error['msg']} (got {_got(value)})"


def _position_for(loc: Path_, message: str, located: Located, origin: str) -> Position:
    for end in range(len(loc), 0, -1):
        if loc[:end] in located.positions:
            return located.positions[loc[:end]]
    # Cross-field rules live at the root: point at the first field the message names.
    for dotted in re.findall(r"\b([a-z_]+(?:\.[a-z_]+)+)", message):
        key = tuple(dotted.split("."))
        if key in located.positions:
            return located.positions[key]
    return (origin, 1, 1)


def _format(position: Position, loc: Path_, message: str) -> str:
    where = position[0] if position[1] == 0 else f"{position[0]}:{position[1]}:{position[2]}"
    field = ".".join(str(p) for p in loc)
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


def validate_located(located: Located, origin: str) -> ServedModel:
    """Validate raw data into a ServedModel, turning every pydantic error into a located message."""
    try:
        return ServedModel.model_validate(located.data)
    except ValidationError as exc:
        located_problems = []
        for error in exc.errors(include_url=False):
            message = _describe(error)
            position = _position_for(error["loc"], message, located, origin)
            located_problems.append((position, _format(position, error["loc"], message)))
        # In file order, the file's own lines first, then included files, then --set overrides.
        located_problems.sort(key=lambda item: (item[0][0] != origin, item[0][1] == 0, item[0][1], item[0][2]))
        raise ManifestError([text for _, text in located_problems]) from None


def load_manifest(
    path: str | Path,
    sets: Sequence[str] = (),
    *,
    check_fallback: bool = True,
    _seen: Iterable[Path] = (),
) -> ServedModel:
    """Load, merge, override and validate a manifest file; raises ManifestError with located messages."""
    path = Path(path)
    located = read_located(path)
    for expr in sets:
        apply_set(located, expr)
    served = validate_located(located, _display(path))
    served._source = path.resolve()
    served._path_bases = path_bases(located, path.resolve().parent)
    if served.weights.derived_from_manifest:
        served._parent = _parent_weights(served, located, _display(path))
    fallback = served.failure_policy.fallback
    if check_fallback and fallback is not None:
        where = _position_for(("failure_policy", "fallback", "manifest"), "", located, _display(path))
        if "\0" in fallback.manifest:
            raise ManifestError([_format(where, ("failure_policy", "fallback", "manifest"), "not a file path")])
        target = served.resolve_path(fallback.manifest).resolve()
        seen = {*_seen, path.resolve()}
        if target in seen:
            raise ManifestError([_format(where, ("failure_policy", "fallback", "manifest"), "fallback cycle")])
        try:
            load_manifest(target, check_fallback=True, _seen=seen)
        except ManifestError as exc:
            message = f"cannot load the fallback manifest: {exc.problems[0]}"
            raise ManifestError([_format(where, ("failure_policy", "fallback", "manifest"), message)]) from None
    return served


def _parent_weights(served: ServedModel, located: Located, origin: str) -> tuple[Weights, Path | None]:
    """The weights of the parent manifest `weights.derived_from` names, and the folder their relative source
    resolves against; a located ManifestError when it cannot be the unquantized parent."""
    field = ("weights", "derived_from")
    where = _position_for(field, "", located, origin)
    derived_from = str(served.weights.derived_from)
    path = served.resolve_path(derived_from)

    def refuse(message: str) -> ManifestError:
        return ManifestError([_format(where, field, message)])

    if not path.is_file():
        raise refuse(f"{path} is not a file: name the manifest of the checkpoint this one was made from")
    try:
        parent = load_manifest(path, check_fallback=False)
    except ManifestError as exc:
        raise refuse(f"cannot load the parent manifest: {exc.problems[0]}") from None
    if parent.weights.derived_from is not None:
        raise refuse(f"that manifest is itself derived from {parent.weights.derived_from}: name the unquantized "
                     "parent directly")  # fmt: skip
    # a GGUF parent may hold unquantized tensors (F16, BF16, F32): its header decides, read in cli/preflight.py
    if parent.weights.quantized_checkpoint and parent.weights.format != "gguf":
        raise refuse(f"the parent's weights are {parent.weights.format}, already quantized: name the unquantized "
                     "checkpoint the build was made from")  # fmt: skip
    source = parent.weights.source
    if _not_relative(source):
        return parent.weights, None
    return parent.weights, parent._path_bases.get(source, parent.base_dir)


def load_fallback(served: ServedModel) -> ServedModel | None:
    """The fallback's ServedModel, or None when the manifest declares no fallback."""
    fallback = served.failure_policy.fallback
    return None if fallback is None else load_manifest(served.resolve_path(fallback.manifest))
