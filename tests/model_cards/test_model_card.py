"""`--model-card README.md`: the Serving section between markers, eval results in model-index, the rest untouched."""

from __future__ import annotations

from pathlib import Path

import pytest
from huggingface_hub import ModelCard
from note_evidence import make_bench, make_report

from servegate.contracts.manifest import ServedModel
from servegate.model_cards.evidence import NoteError
from servegate.model_cards.model_card import END, START
from servegate.model_cards.note_files import write_note

CARD = """---
license: mit
language:
- en
tags:
- tiny
- demo
custom_field:
  nested: 7
model-index:
- name: servegate/tiny-primary
  results:
  - task:
      type: text-generation
    dataset:
      name: Other Bench
      type: org/other-bench
    metrics:
    - type: accuracy
      value: 0.5
---

# servegate/tiny-primary

A tiny model | with a pipe.

## Usage

```python
print("hello")
```

## Citation

Cite us.
"""


def _body(text: str) -> str:
    """The card's text after the YAML block, without the Serving section."""
    body = text.split("\n---\n", 1)[1]
    if START in body:
        head, rest = body.split(START, 1)
        body = head + rest.split(END, 1)[1]
    return body


def test_card_round_trip_keeps_everything_else(served: ServedModel, tmp_path: Path) -> None:
    card_path = tmp_path / "README.md"
    card_path.write_text(CARD, encoding="utf-8")
    write_note(served, make_report(served), tmp_path / "SERVING.md", bench=make_bench(), model_card=card_path)

    text = card_path.read_text(encoding="utf-8")
    card = ModelCard.load(card_path)
    original = ModelCard(CARD)
    data, before = card.data.to_dict(), original.data.to_dict()
    for key in ("license", "language", "tags", "custom_field"):
        assert data[key] == before[key]

    results = card.data.eval_results
    assert ("org/other-bench", "accuracy", 0.5) in [(r.dataset_type, r.metric_type, r.metric_value) for r in results]
    ours = {(r.dataset_name, r.metric_type): r for r in results if r.metric_args and "serving" in r.metric_args}
    assert set(ours) == {
        ("arith", "exact_match"),
        ("recall", "exact_match"),
        ("json", "exact_match"),
        ("json", "json_schema_valid"),
    }
    arith = ours[("arith", "exact_match")]
    assert arith.metric_value == 0.89 and arith.dataset_type == "zoo:arith"
    assert arith.metric_args["serving"]["quantization"] == "int8-weight"
    assert arith.metric_args["serving"]["fingerprint"] == served.fingerprint
    assert arith.metric_args["serving"]["batching"] == "continuous"

    assert text.count(START) == 1 and text.count(END) == 1
    assert _body(text).rstrip("\n") == _body(CARD).rstrip("\n")
    section = text.split(START, 1)[1].split(END, 1)[0]
    assert "## Serving" in section and "### 1. Model identity" in section and "### 7. Observability" in section
    assert "](SERVING.latency-cdf.png)" in section and "[SERVING.md](SERVING.md)" in section


def test_rerun_replaces_the_section_and_our_results(served: ServedModel, tmp_path: Path) -> None:
    card_path = tmp_path / "README.md"
    card_path.write_text(CARD, encoding="utf-8")
    write_note(served, make_report(served), tmp_path / "SERVING.md", model_card=card_path)
    report = make_report(served)
    report["gates"][0]["measurements"]["suites"]["arith"]["exact_match"]["candidate_score"] = 0.875
    write_note(served, report, tmp_path / "SERVING.md", model_card=card_path)

    text = card_path.read_text(encoding="utf-8")
    assert text.count(START) == 1 and text.count("## Serving") == 1
    results = ModelCard.load(card_path).data.eval_results
    arith = [r for r in results if r.dataset_name == "arith"]
    assert [r.metric_value for r in arith] == [0.875]
    assert len(results) == 5  # the other bench's result and our four


def test_card_in_another_folder_links_back_to_the_note(served: ServedModel, tmp_path: Path) -> None:
    card_dir = tmp_path / "card"
    card_dir.mkdir()
    (card_dir / "README.md").write_text("# Just a title\n\nSome words.\n", encoding="utf-8")
    write_note(served, make_report(served), tmp_path / "docs" / "SERVING.md", model_card=card_dir / "README.md")
    text = (card_dir / "README.md").read_text(encoding="utf-8")
    assert text.split("\n---\n", 1)[1].startswith("# Just a title\n\nSome words.\n")
    assert "[../docs/SERVING.md](../docs/SERVING.md)" in text
    assert ModelCard.load(card_dir / "README.md").data.model_name == "servegate/tiny-primary"


def test_broken_markers_are_refused_and_nothing_written(served: ServedModel, tmp_path: Path) -> None:
    card_path = tmp_path / "README.md"
    card_path.write_text(CARD + f"\n{START}\nhalf a section\n", encoding="utf-8")
    with pytest.raises(NoteError, match="markers are broken"):
        write_note(served, make_report(served), tmp_path / "SERVING.md", model_card=card_path)
    assert card_path.read_text(encoding="utf-8").endswith("half a section\n")
    assert not (tmp_path / "SERVING.md").exists()
