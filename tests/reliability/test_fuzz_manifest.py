"""Fuzzing the manifest loader: whatever a file holds, the answer is a ServedModel or a located ManifestError.

Three generators: random YAML trees (keys drawn from the real field names and from noise), random YAML
token soup (anchors, merge keys, tags, flow and block syntax, several documents), and mutations of the
shipped examples (structural edits of their data, and raw text edits of their files, includes and
fallbacks resolving as they do for users). Every problem line must start with the file (or `--set`) it
is about. The located messages of hand-picked invalid manifests are covered in tests/contracts/.
"""

from __future__ import annotations

import copy
import io
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from ruamel.yaml import YAML

from servegate.contracts.errors import ManifestError, ServegateError
from servegate.contracts.loading import _model_in, load_manifest
from servegate.contracts.manifest import ServedModel

pytestmark = pytest.mark.reliability

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FAST_EXAMPLES, SLOW_EXAMPLES = 80, 1500
LOCATED = re.compile(r"^(?P<origin>[^\x00]+?)(?::(?P<line>\d+):(?P<col>\d+))?: (?P<message>.+)", re.DOTALL)


def _field_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    """Every field name at every level of the manifest (fuzzed keys are drawn from these half of the time)."""
    seen = seen or set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for field in model.model_fields.values():
        inner = _model_in(field.annotation)
        if inner is not None:
            names |= _field_names(inner, seen)
    return names


FIELD_NAMES = sorted(_field_names(ServedModel) | {"include"})
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
    | st.sampled_from(["zoo:tiny-primary", "zoo:../../etc", "hf:a/b@main", "2GiB", "-1KiB", "continuous", "x" * 300])
)
KEYS = st.sampled_from(FIELD_NAMES) | st.text(min_size=1, max_size=12)
TREES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=6),
    max_leaves=30,
)
YAML_TOKENS = st.sampled_from(
    [
        "name: fuzz\n",
        "weights:\n  source: zoo:tiny-primary\n",
        "weights: {source: ",
        "}\n",
        "]\n",
        "[",
        "runtime:\n",
        "  kv_cache:\n",
        "    memory_budget: 2GiB\n",
        "batching: {mode: continuous}\n",
        "include: base.yaml\n",
        "include: [",
        'include: "a\\0b"\n',
        "include: .\n",
        "&anchor ",
        "*anchor\n",
        "<<: *anchor\n",
        "<<: {max_model_len: 64}\n",
        "!!binary aGk=\n",
        "!!set {a, b}\n",
        "!!python/name:os.system\n",
        "!custom ",
        "? [a, b]\n: 1\n",
        "---\n",
        "...\n",
        "%YAML 1.1\n",
        "\t",
        "  ",
        "- ",
        ": ",
        "'",
        '"',
        "#",
        "\x00",
        "\ufeff",
        "\u2028",
        "1e400\n",
        ".nan\n",
        "~\n",
        "0x1F\n",
        "2001-12-14\n",
        "yes\n",
        "failure_policy: {fallback: {manifest: ",
        "fallback.yaml}}\n",
        "manifest.yaml}}\n",
        '"\\0"}}\n',
    ]  # fmt: skip
)


def _yaml_text(data: Any) -> str:
    buffer = io.StringIO()
    yaml = YAML(typ="safe")
    yaml.default_flow_style = False
    yaml.dump(data, buffer)
    return buffer.getvalue()


def assert_loads_or_located(path: Path, root: Path, sets: list[str] | None = None) -> str:
    """Load `path`; a ServedModel or a ManifestError/ServegateError whose every problem names its file.

    Returns the outcome: "valid", "manifest_error" or "set_error".
    """
    try:
        served = load_manifest(path, sets or [])
    except ManifestError as exc:
        assert exc.problems, "a ManifestError without problems"
        for problem in exc.problems:
            match = LOCATED.match(problem)
            assert match, f"problem is not located: {problem!r}"
            origin = match["origin"]
            if origin.startswith("--set "):
                continue
            named = Path(origin) if Path(origin).is_absolute() else Path.cwd() / origin
            assert named.resolve().is_relative_to(root.resolve()), f"problem names {origin!r}, outside {root}"
        return "manifest_error"
    except ServegateError as exc:  # --set usage errors name the expression
        assert sets and str(exc).startswith("--set "), f"unlocated error: {exc}"
        return "set_error"
    assert isinstance(served, ServedModel)
    return "valid"


def _walk(data: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a tree of dicts and lists (the root included)."""
    out = [path]
    if isinstance(data, dict):
        for key, value in data.items():
            out += _walk(value, (*path, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            out += _walk(value, (*path, i))
    return out


def _parent(data: Any, path: tuple[Any, ...]) -> Any:
    for part in path[:-1]:
        data = data[part]
    return data


def mutate(data: Any, draw: Callable[[st.SearchStrategy[Any]], Any]) -> Any:
    """One structural edit of a manifest tree: delete, replace, add an unknown key, retype, typo a key."""
    data = copy.deepcopy(data)
    paths = [p for p in _walk(data) if p]
    if not paths:
        return draw(TREES)
    path = draw(st.sampled_from(paths))
    parent, last = _parent(data, path), path[-1]
    kind = draw(st.sampled_from(["delete", "replace", "add", "wrap", "typo", "boundary"]))
    if kind == "delete":
        del parent[last]
    elif kind == "replace":
        parent[last] = draw(TREES)
    elif kind == "add" and isinstance(parent, dict):
        parent[draw(KEYS)] = draw(TREES)
    elif kind == "wrap":
        parent[last] = [parent[last]]
    elif kind == "typo" and isinstance(parent, dict) and isinstance(last, str) and last:
        i = draw(st.integers(0, len(last) - 1))
        parent[last[:i] + last[i + 1 :] + draw(st.sampled_from(["", "s", "_"]))] = parent.pop(last)
    else:
        parent[last] = draw(st.sampled_from([0, -1, 1, 2**31, 2**63, 2**64, 0.5, -0.0, 1e308, "", "0", True, None]))
    return data


def text_edit(text: str, draw: Callable[[st.SearchStrategy[Any]], Any]) -> str:
    """One raw edit of a file's text: cut, insert noise, swap two lines, re-indent, truncate."""
    kind = draw(st.sampled_from(["cut", "insert", "swap", "indent", "truncate"]))
    lines = text.splitlines(keepends=True)
    if kind == "cut" and text:
        a = draw(st.integers(0, len(text) - 1))
        return text[:a] + text[a + draw(st.integers(1, 40)) :]
    if kind == "insert":
        a = draw(st.integers(0, len(text)))
        return text[:a] + draw(YAML_TOKENS | st.text(max_size=8)) + text[a:]
    if kind == "swap" and len(lines) > 1:
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        lines[i], lines[j] = lines[j], lines[i]
        return "".join(lines)
    if kind == "indent" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        lines[i] = draw(st.sampled_from(["", " ", "   ", "\t"])) + lines[i].lstrip(" ")
        return "".join(lines)
    return text[: draw(st.integers(0, len(text)))]


@pytest.fixture
def examples_copy(tmp_path: Path) -> Path:
    """A copy of examples/ (includes and fallbacks resolve inside it)."""
    target = tmp_path / "examples"
    shutil.copytree(EXAMPLES, target, ignore=shutil.ignore_patterns("checkpoints"))  # `make checkpoints` builds
    return target


def _example_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.yaml"))


def _fuzz(max_examples: int, body: Callable[..., str], figures: Any, label: str, **strategies: Any) -> None:
    outcomes: dict[str, int] = {}

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    )
    @given(**strategies)
    def run(**drawn: Any) -> None:
        outcome = body(**drawn)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    run()
    figures.count(f"{label}: cases", sum(outcomes.values()))
    for outcome, n in sorted(outcomes.items()):
        figures.count(f"{label}: {outcome}", n)
    figures.count("crashes", 0)
    assert sum(outcomes.values()) >= max_examples // 2  # hypothesis really ran the budget


BUDGETS = [pytest.param(FAST_EXAMPLES, id="fast"), pytest.param(SLOW_EXAMPLES, id="long", marks=pytest.mark.slow)]


@pytest.mark.parametrize("budget", BUDGETS)
def test_random_yaml_trees_load_or_fail_located(tmp_path: Path, figures: Any, budget: int) -> None:
    path = tmp_path / "fuzz.yaml"

    def body(tree: Any) -> str:
        path.write_text(_yaml_text(tree), encoding="utf-8")
        return assert_loads_or_located(path, tmp_path)

    _fuzz(budget, body, figures, "yaml trees", tree=TREES)


@pytest.mark.parametrize("budget", BUDGETS)
def test_yaml_token_soup_loads_or_fails_located(examples_copy: Path, figures: Any, budget: int) -> None:
    path = examples_copy / "quickstart" / "soup.yaml"

    def body(tokens: list[str], raw: bytes) -> str:
        path.write_bytes("".join(tokens).encode("utf-8", "surrogatepass") + raw)
        return assert_loads_or_located(path, examples_copy)

    _fuzz(
        budget, body, figures, "yaml token soup", tokens=st.lists(YAML_TOKENS, max_size=30), raw=st.binary(max_size=4)
    )


@pytest.mark.parametrize("budget", BUDGETS)
def test_mutated_examples_load_or_fail_located(examples_copy: Path, figures: Any, budget: int) -> None:
    files = _example_files(examples_copy)
    originals = {p: p.read_text(encoding="utf-8") for p in files}
    parsed = {p: YAML(typ="safe").load(text) for p, text in originals.items()}
    dependents = {p: [q for q in files if q != p and p.name in originals[q]][:2] for p in files}

    def body(index: int, edits: int, raw: bool, data: st.DataObject) -> str:
        target = files[index % len(files)]
        try:
            if raw:
                text = originals[target]
                for _ in range(edits):
                    text = text_edit(text, data.draw)
                target.write_text(text, encoding="utf-8")
            else:
                tree = parsed[target]
                for _ in range(edits):
                    tree = mutate(tree, data.draw)
                target.write_text(_yaml_text(tree), encoding="utf-8")
            # the edited file itself, and the manifests that include it or name it as their fallback
            outcomes = [assert_loads_or_located(p, examples_copy) for p in [target, *dependents[target]]]
            return "valid" if all(o == "valid" for o in outcomes) else "manifest_error"
        finally:
            target.write_text(originals[target], encoding="utf-8")

    _fuzz(
        budget // 2,
        body,
        figures,
        "mutated examples (all examples loaded per case)",
        index=st.integers(0, 1000),
        edits=st.integers(1, 3),
        raw=st.booleans(),
        data=st.data(),
    )


SET_PATHS = st.sampled_from(
    [
        "batching.mode",
        "batching.max_batch_size",
        "runtime.kv_cache.block_size",
        "runtime.kv_cache",
        "preprocess.max_input_tokens",
        "quality.suites.0.limit",
        "quality.suites.9.limit",
        "name",
        "weights",
        "failure_policy.fallback.manifest",
        "runtime.warmup.0",
        "postprocess.stop.0",
        "a..b",
        "",
        ".",
        "x.-1",
    ]  # fmt: skip
) | st.text(max_size=12)
SET_VALUES = st.sampled_from(["3", "0", "-1", "true", "[a, b]", "{k: v}", "null", "'", "[", "2GiB", "*a", "!!binary x"])


@pytest.mark.parametrize("budget", BUDGETS)
def test_random_set_overrides_load_or_fail_located(examples_copy: Path, figures: Any, budget: int) -> None:
    manifest = examples_copy / "quickstart" / "manifest.yaml"

    def body(pairs: list[tuple[str, str]], equals: bool) -> str:
        sets = [f"{p}={v}" if equals else f"{p}{v}" for p, v in pairs]
        return assert_loads_or_located(manifest, examples_copy, sets)

    values = SET_VALUES | st.text(max_size=10)
    _fuzz(budget, body, figures, "--set overrides", pairs=st.lists(st.tuples(SET_PATHS, values), max_size=3),
          equals=st.booleans())  # fmt: skip


@pytest.mark.parametrize(
    "text",
    [
        pytest.param('include: "a\\0b"\nname: x\n', id="nul-in-include"),
        pytest.param(
            'name: x\nweights: {source: zoo:tiny-primary}\nfailure_policy: {fallback: {manifest: "a\\0b"}}\n',
            id="nul-in-fallback",
        ),
        pytest.param("name: x\nweights: {source: zoo:tiny-primary}\nruntime: {<<: {max_model_len: 64}}\n", id="merge"),
        pytest.param("name: x\nweights: {source: zoo:tiny-primary}\ndescription: " + "[" * 700 + "]" * 700, id="deep"),
    ],
)
def test_inputs_fuzzing_found_are_located_errors(tmp_path: Path, text: str) -> None:
    """Regression cases the fuzzers found (a NUL in a path, a YAML merge key, very deep nesting)."""
    path = tmp_path / "found.yaml"
    path.write_text(text, encoding="utf-8")
    assert assert_loads_or_located(path, tmp_path) in {"manifest_error", "valid"}


def test_keys_with_blanks_and_nul_are_located(tmp_path: Path) -> None:
    """Found by the long fuzz run (a test-side parse of the message, kept as a case): odd key names."""
    path = tmp_path / "keys.yaml"
    path.write_text(_yaml_text({" ": 1, " \x00": 2, "a: b": 3, "\n": 4}), encoding="utf-8")
    assert assert_loads_or_located(path, tmp_path) == "manifest_error"
