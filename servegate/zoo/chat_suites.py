"""Seeded generators of the zoo's chat suites, `extraction` and `tools`, for instruct models (SmolLM2 and up);
they reproduce the committed JSONL byte for byte. Regenerate with ``python -m servegate.zoo.chat_suites``.

Item fields: ``id``, ``prompt`` (the user's message), ``reference`` (JSON text: the object to extract, or the
call {"name", "arguments"} to make) and, as JSON text, ``schema`` (extraction: the JSON Schema the answer is
decoded under) or ``tools`` (tools: the functions offered) with ``tool_choice`` (`required`: the grammar
engine makes every answer a call, so the suite measures which call, not whether one parses).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from servegate.zoo.eval_suites import CHAT_SUITES, SUITES_DIR

SIZE = 48
SEEDS = {"extraction": 7001, "tools": 7002}

NAMES = ("Maria", "Tom", "Aiko", "Lars", "Priya", "Omar", "Chen", "Sofia", "Kwame", "Elena", "Diego", "Hana")
CITIES = ("Paris", "Oslo", "Lima", "Tokyo", "Cairo", "Berlin", "Madrid", "Toronto", "Nairobi", "Seoul")
PRODUCTS = ("chair", "lamp", "notebook", "kettle", "backpack", "mug", "pencil", "towel")
CURRENCIES = ("USD", "EUR", "GBP", "JPY")


def _object(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


PERSON = _object({"name": {"type": "string", "maxLength": 24}, "age": {"type": "integer", "minimum": 0,
                  "maximum": 120}, "city": {"type": "string", "maxLength": 24}})  # fmt: skip
ORDER = _object({"product": {"type": "string", "maxLength": 24}, "quantity": {"type": "integer", "minimum": 1,
                 "maximum": 1000}})  # fmt: skip


def _tool(name: str, description: str, properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description,
                                             "parameters": _object(properties)}}  # fmt: skip


TOOLS = [
    _tool("get_weather", "The current weather in a city", {"city": {"type": "string", "maxLength": 24}}),
    _tool("set_timer", "Start a countdown timer", {"minutes": {"type": "integer", "minimum": 1, "maximum": 600}}),
    _tool(
        "convert_currency",
        "Convert an amount of money from one currency to another",
        {"amount": {"type": "number"}, "source": {"enum": list(CURRENCIES)}, "target": {"enum": list(CURRENCIES)}},
    ),
]


def _extraction(rng: random.Random) -> tuple[str, Any, dict[str, Any]]:
    if rng.random() < 0.5:
        name, age, city = rng.choice(NAMES), rng.randint(18, 90), rng.choice(CITIES)
        text = rng.choice(
            (f"{name} is {age} years old and lives in {city}.", f"Living in {city}, {name} turned {age} this year.")
        )
        return f"Extract the person's name, age and city as JSON.\nText: {text}", PERSON, {
            "name": name, "age": age, "city": city}  # fmt: skip
    product, quantity = rng.choice(PRODUCTS), rng.randint(2, 40)
    text = rng.choice((f"Please send {quantity} of the {product} to our office.", f"We need {quantity} {product}s."))
    return f"Extract the product and the quantity ordered as JSON.\nText: {text}", ORDER, {
        "product": product, "quantity": quantity}  # fmt: skip


def _call(rng: random.Random) -> tuple[str, dict[str, Any]]:
    kind = rng.randrange(3)
    if kind == 0:
        city = rng.choice(CITIES)
        return f"What is the weather like in {city} right now?", {"name": "get_weather", "arguments": {"city": city}}
    if kind == 1:
        minutes = rng.randint(2, 90)
        return f"Set a timer for {minutes} minutes.", {"name": "set_timer", "arguments": {"minutes": minutes}}
    amount = rng.randint(5, 500)
    source, target = rng.sample(CURRENCIES, 2)
    arguments = {"amount": amount, "source": source, "target": target}
    return f"How much is {amount} {source} in {target}?", {"name": "convert_currency", "arguments": arguments}


def items(suite: str) -> Iterator[dict[str, Any]]:
    """The items of chat suite `suite` (`extraction` or `tools`), in order."""
    rng = random.Random(SEEDS[suite])
    for i in range(SIZE):
        row: dict[str, Any] = {"id": f"{suite}-test-{i:04d}"}
        if suite == "extraction":
            prompt, schema, reference = _extraction(rng)
            row.update(prompt=prompt, reference=json.dumps(reference), schema=json.dumps(schema))
        else:
            prompt, call = _call(rng)
            row.update(prompt=prompt, reference=json.dumps(call), tools=json.dumps(TOOLS), tool_choice="required")
        yield row


def suite_file(suite: str) -> Path:
    """Where chat suite `suite` is committed."""
    return SUITES_DIR / f"{suite}.test.jsonl"


def render(suite: str) -> str:
    """The JSONL text of chat suite `suite`."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in items(suite))


def main() -> None:
    """Write every chat suite's file."""
    for suite in CHAT_SUITES:
        suite_file(suite).write_text(render(suite), encoding="utf-8")
        print(f"wrote {suite_file(suite)} ({SIZE} items)")


if __name__ == "__main__":
    main()
