"""Checks of a short chat answer: what the `contains_answer` and `format_followed` metric modules score.

`contains_answer`: normalise both sides (casefold; every character that is not a letter or digit becomes a
space; whitespace collapsed), then the reference is found in the answer as whole words. A reference may list
alternatives separated by `|` (`4|four`); any one of them counts. `format_followed`: the answer obeys the item's
rule, a JSON object {"rule": NAME, ...} (RULES says what each name checks and which fields it takes).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_NOT_WORD = re.compile(r"[\W_]+")
_INTEGER = re.compile(r"[+-]?\d+")


def normalise(text: str) -> str:
    """`text` casefolded, every run of non-alphanumeric characters one space, stripped."""
    return _NOT_WORD.sub(" ", text.casefold()).strip()


def contains_answer(answer: str, reference: str) -> bool:
    """Whether one of the `|`-separated alternatives of `reference` occurs in `answer` as whole words, case and
    punctuation aside (an alternative that normalises to nothing never matches)."""
    said = f" {normalise(answer)} "
    wanted = (normalise(alternative) for alternative in reference.split("|"))
    return any(word and f" {word} " in said for word in wanted)


def _words(answer: str) -> list[str]:
    return normalise(answer).split()


def _letters(answer: str) -> str:
    return "".join(ch for ch in answer if ch.isalpha())


def _bare(answer: str) -> str:
    """The answer without surrounding whitespace, quotes and one final full stop."""
    return answer.strip().removesuffix(".").strip("\"'`").removesuffix(".").strip()


def _starts_with(answer: str, text: str) -> bool:
    said = f"{normalise(answer)} "
    return any(word and said.startswith(f"{word} ") for word in map(normalise, text.split("|")))


def _count(rule: dict[str, Any]) -> int:
    return int(rule["n"])


RULES: dict[str, tuple[tuple[str, ...], Callable[[str, dict[str, Any]], bool]]] = {
    "uppercase": ((), lambda a, r: bool(_letters(a)) and _letters(a) == _letters(a).upper()),
    "lowercase": ((), lambda a, r: bool(_letters(a)) and _letters(a) == _letters(a).lower()),
    "integer": ((), lambda a, r: _INTEGER.fullmatch(_bare(a)) is not None),
    "max_words": (("n",), lambda a, r: 1 <= len(_words(a)) <= _count(r)),
    "exact_words": (("n",), lambda a, r: len(_words(a)) == _count(r)),
    "one_of": (("options",), lambda a, r: normalise(a) in {normalise(o) for o in r["options"]}),
    "starts_with": (("text",), lambda a, r: _starts_with(a, r["text"])),
    "contains": (("text",), lambda a, r: contains_answer(a, r["text"])),
    "lines": (("n",), lambda a, r: len([line for line in a.splitlines() if line.strip()]) == _count(r)),
    "comma_list": (("n",), lambda a, r: len([p for p in _bare(a).split(",") if p.strip()]) == _count(r)
                   and a.count(",") == _count(r) - 1),
}  # fmt: skip
"""Rule name -> (the fields it takes, its check on the answer). uppercase / lowercase: the answer has letters and
none of the other case; integer: only an integer (an optional sign and digits; surrounding quotes and one final
full stop allowed); max_words: 1 to `n` words; exact_words: exactly `n` words; one_of: the whole answer is one
of `options` (case and punctuation aside); starts_with: its first words are `text` (or one of its `|`-separated
alternatives); contains: `text` occurs as whole words (alternatives too); lines: exactly `n` non-blank lines;
comma_list: exactly `n` non-empty items separated by `n - 1` commas. Words are what `normalise` leaves between
spaces, so `well-known` is two."""


_SHAPE = 'a format rule is a JSON object {"rule": NAME, ...}'


def parse_rule(rule: str | dict[str, Any]) -> dict[str, Any]:
    """The rule as a dict, checked (ValueError naming the problem and the known rules for one that cannot be)."""
    try:
        parsed = json.loads(rule) if isinstance(rule, str) else rule
    except ValueError as exc:
        raise ValueError(f"{_SHAPE}; {rule!r} is not JSON: {exc}") from None
    name = parsed.get("rule") if isinstance(parsed, dict) else parsed
    if not isinstance(name, str) or name not in RULES:
        raise ValueError(f"unknown format rule {name!r}: {_SHAPE} with NAME one of {', '.join(RULES)}")
    fields, _ = RULES[name]
    missing = [f for f in fields if f not in parsed]
    if missing:
        raise ValueError(f"format rule {name!r} needs {', '.join(missing)} (got {json.dumps(parsed)})")
    n = parsed.get("n", 1)
    if "n" in fields and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"format rule {name!r}: n must be an integer >= 1 (got {n!r})")
    options = parsed.get("options", [""])
    if not isinstance(options, list) or not options or not all(isinstance(o, str) for o in options):
        raise ValueError(f"format rule {name!r}: options must be a non-empty list of strings (got {options!r})")
    if not isinstance(parsed.get("text", ""), str):
        raise ValueError(f"format rule {name!r}: text must be a string (got {parsed['text']!r})")
    return parsed


def follows(answer: str, rule: str | dict[str, Any]) -> bool:
    """Whether `answer` obeys `rule` (a dict or its JSON text; see RULES)."""
    parsed = parse_rule(rule)
    return RULES[parsed["rule"]][1](answer, parsed)
