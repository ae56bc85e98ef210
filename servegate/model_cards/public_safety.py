"""Public safety of the serving note: nothing from private suites, no tenant ids, no raw prompts.

The evidence is not trusted. The check report promises that failure examples from suites not marked
`public` carry only ids and lengths; the note enforces it again, in three layers:

1. structure: evidence from a suite the manifest does not mark public keeps only its id and lengths;
   keys that hold request text or identities (prompt, text, tenant, user, ...) are dropped everywhere
   except in public failure examples; private suites are shown under an alias (`private-1`);
2. strings: a string value in the measurements survives only when it is one the note may show anyway
   (a manifest value, a public suite, gate or metric name) or a short lowercase identifier (a unit, a mode);
   quoted text in a gate's reason is withheld unless it is such a string;
3. content: the finished note is scanned for every text of the private suites' items; a hit stops the note.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from servegate.contracts.manifest import ServedModel
from servegate.contracts.report.check_report import (
    CheckReport,
    FailureExample,
    GateRecord,
    ManifestSide,
    measurements_record,
)
from servegate.model_cards.evidence import NoteError

WITHHELD = "[withheld]"
# Keys that hold request text or identities; under them only numbers survive (e.g. `prompt_chars`, `tenant_count`).
_SENSITIVE_KEY = re.compile(
    r"(tenant|user|prompt|(^|_)texts?($|_)|content|message|header|host|url|token_ids|(^|_)raw($|_)|body|completion)",
    re.IGNORECASE,
)
_ID = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")
_COMMAND = re.compile(r"^gate [a-z]+( --?[a-z-]+)*$")  # servegate's own commands, as reasons name them
_NUMBER = re.compile(r"^-?\d+(\.\d+)?%?$")
_ENUM = re.compile(r"^[a-z][a-z0-9_./-]{0,31}$")
_QUOTED = re.compile(r"'([^']*)'|\"([^\"]*)\"|`([^`]*)`")
_EXAMPLE_TEXT = ("prompt", "reference", "baseline", "candidate")
_MIN_SCAN_CHARS = 8  # shorter item texts ("42", "yes") occur in any note by chance
MAX_REASON_CHARS = 300
MAX_EXAMPLE_CHARS = 400


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _field_paths(data: Any, prefix: str = "") -> Iterable[str]:
    """Dotted paths of a manifest's fields (`preprocess.max_input_tokens`), which gate reasons quote."""
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            yield path
            yield str(key)
            yield from _field_paths(value, path)


class PublicFilter:
    """Filters evidence for one manifest down to what a public note may say."""

    def __init__(self, served: ServedModel, extra_names: Iterable[str] = ()) -> None:
        suites = served.quality.suites
        self.public = {s.name for s in suites if s.public}
        self.private = [s for s in suites if not s.public]
        self.alias = {s.name: f"private-{i}" for i, s in enumerate(self.private, start=1)}
        for s in self.private:
            self.alias.setdefault(s.dataset, self.alias[s.name])
        metrics = {m for s in suites for m in s.metrics}
        public_datasets = {s.dataset for s in suites if s.public}
        # Values the note prints anyway: the six elements' own strings, public suite and metric names.
        self.allowed = (
            {s for s in _strings(served.six_elements()) if len(s) <= 200}
            | self.public
            | public_datasets
            | metrics
            | set(extra_names)
        ) - set(self.alias)
        self.field_paths = set(_field_paths(served.model_dump(mode="json")))
        self._served = served
        self._private_texts: list[tuple[str, str]] | None = None
        self.unscanned: list[str] = []
        """Aliases of private suites whose items could not be read for the content scan."""

    # --- layer 1 and 2: structure and strings ------------------------------------------------------

    def suite_label(self, name: Any) -> str | None:
        """A public suite's own name, a private suite's alias, or None for no/unknown suite."""
        if not isinstance(name, str):
            return None
        if name in self.public:
            return name
        return self.alias.get(name, "private")

    def is_public_suite(self, name: Any) -> bool:
        """Whether the manifest marks this suite public (an unknown suite never is)."""
        return isinstance(name, str) and name in self.public

    def string(self, value: str) -> str:
        """A measurement string as the note may show it."""
        if value in self.alias:
            return self.alias[value]
        if value in self.allowed or _ENUM.match(value):
            return value
        return WITHHELD

    def text(self, value: str, limit: int = MAX_REASON_CHARS) -> str:
        """Free text (a gate's reason): private suite names aliased, quoted text withheld unless allowed."""
        for name in sorted(self.alias, key=len, reverse=True):
            value = re.sub(rf"(?<![\w-]){re.escape(name)}(?![\w-])", self.alias[name], value)

        def quote(match: re.Match[str]) -> str:
            inner = next(g for g in match.groups() if g is not None)
            known = inner in self.allowed or inner in self.field_paths or inner in self.alias.values()
            if known or _NUMBER.match(inner) or _COMMAND.match(inner):
                return match.group(0)
            return match.group(0)[0] + WITHHELD + match.group(0)[-1]

        value = _QUOTED.sub(quote, value)
        return value if len(value) <= limit else value[: limit - 1] + "…"

    def measurements(self, value: Any, *, keep_keys: bool = False) -> Any:
        """Numbers and booleans kept; strings filtered; request-text keys, tenant keys and private suites dropped.

        `keep_keys`: a record's own keys stay (its schema requires them), their text emptied instead: a string
        withheld, a list or map emptied.
        """
        if isinstance(value, bool | int | float) or value is None:
            return value
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, list | tuple):
            out = []
            for item in value:
                if isinstance(item, dict) and "suite" in item and not self.is_public_suite(item["suite"]):
                    continue  # a per-suite row of a private suite
                out.append(self.measurements(item, keep_keys=keep_keys))
            return out
        if isinstance(value, dict):
            kept: dict[str, Any] = {}
            for key, item in value.items():
                key = str(key)
                if key in self.alias or any(part in self.alias for part in re.split(r"[/:\s]", key)):
                    continue  # results keyed by a private suite (`held_out`, `held_out/exact_match`)
                if _SENSITIVE_KEY.search(key) and not (isinstance(item, bool | int | float) or item is None):
                    if keep_keys:
                        kept[key] = [] if isinstance(item, list | tuple) else {} if isinstance(item, dict) else WITHHELD
                    continue  # text, or a map keyed by tenants or prompts
                kept[key if _ID.match(key) else WITHHELD] = self.measurements(item, keep_keys=keep_keys)
            return kept
        return WITHHELD

    def example(self, example: Any) -> dict[str, Any]:
        """One failure example: texts only from a public suite, otherwise the id and the lengths."""
        if not isinstance(example, dict):
            return {"suite": None, "id": None}
        suite = example.get("suite")
        item_id = example.get("id")
        out: dict[str, Any] = {
            "suite": self.suite_label(suite),
            "id": item_id if isinstance(item_id, str | int) and _ID.match(str(item_id)) else None,
        }
        if self.is_public_suite(suite):
            for key in _EXAMPLE_TEXT:
                text = example.get(key)
                if isinstance(text, str):
                    out[key] = text if len(text) <= MAX_EXAMPLE_CHARS else text[: MAX_EXAMPLE_CHARS - 1] + "…"
            return out
        for key, value in example.items():
            if key.endswith(("_chars", "_tokens", "_len", "_length")) and isinstance(value, int):
                out[key] = value
        for key in _EXAMPLE_TEXT:  # a report that broke its promise: keep only the length of the text
            if isinstance(example.get(key), str) and f"{key}_chars" not in out:
                out[f"{key}_chars"] = len(example[key])
        return out

    def report(self, report: CheckReport) -> CheckReport:
        """The check report reduced to what the note may show: the same schema, its strings filtered, the
        sides reduced to names and the candidate's fingerprint."""
        return report.model_copy(
            update={
                "baseline": ManifestSide(name=self.string(report.baseline.name)),
                "candidate": ManifestSide(name=self.string(report.candidate.name), fingerprint=report.fingerprint),
                "baseline_git": None,
                "notes": [],
                "gates": [self._gate(g) for g in report.gates],
            }
        )

    def _gate(self, gate: GateRecord) -> GateRecord:
        """One gate's result with its reason, measurements and failure examples filtered."""
        kept = self.measurements(gate.measurements.model_dump(mode="json"), keep_keys=True)
        return GateRecord(
            name=self.string(gate.name),
            verdict=gate.verdict,
            reason=self.text(gate.reason),
            measurements=measurements_record(gate.name, kept),  # the filter keeps every key a record requires
            evidence=[FailureExample.model_validate(self.example(e.model_dump(mode="json"))) for e in gate.evidence],
            duration_s=gate.duration_s,
        )

    # --- layer 3: content ----------------------------------------------------------------------------

    def private_texts(self) -> list[tuple[str, str]]:
        """(alias, text) for every text of every private suite's items (read once, public items excluded)."""
        if self._private_texts is None and not self.private:
            self._private_texts = []
        if self._private_texts is None:
            public_texts: set[str] = set()
            for suite in self._served.quality.suites:
                if suite.public:
                    public_texts.update(_item_texts(self._served, suite.dataset, suite.split, suite.limit) or [])
            found: list[tuple[str, str]] = []
            for suite in self.private:
                texts = _item_texts(self._served, suite.dataset, suite.split, suite.limit)
                if texts is None:
                    self.unscanned.append(self.alias[suite.name])
                    continue
                found += [(self.alias[suite.name], t) for t in texts if t not in public_texts]
            self._private_texts = found
        return self._private_texts

    def assert_public(self, *documents: str) -> None:
        """Raise NoteError when any private suite text occurs in the documents (the note is then not written)."""
        for alias, text in self.private_texts():
            if any(text in doc for doc in documents):
                raise NoteError(
                    f"serving note: text of an item of suite {alias} (not public) would appear in the note; "
                    "nothing was written. The evidence carries private text: check the gate that produced it."
                )


def _read_rows(path: Path) -> list[dict[str, Any]]:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, list) else list(data.get("data", []))
    if suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return list(csv.DictReader(handle))
    from servegate.zoo.eval_suites import load_suite  # parquet: through datasets

    return load_suite(str(path))


def _item_texts(served: ServedModel, dataset: str, split: str, limit: int | None) -> list[str] | None:
    """Every string of a suite's items except the id (None when the suite cannot be read here)."""
    try:
        if dataset.startswith("hf:"):
            return None
        if dataset.startswith("zoo:"):
            from servegate.zoo.eval_suites import resolve_suite

            path = resolve_suite(dataset, split)
        else:
            path = served.resolve_path(dataset)
        rows = _read_rows(path)
    except Exception:  # noqa: BLE001 - any unreadable suite is reported as unscanned, never fatal
        return None
    rows = rows[:limit] if limit is not None else rows
    texts = {
        text.strip()
        for row in rows
        if isinstance(row, dict)
        for key, value in row.items()
        if key != "id"
        for text in _strings(value)
        if len(text.strip()) >= _MIN_SCAN_CHARS
    }
    return sorted(texts)
