"""The contract gate's chat-template probe: a template that keeps every message passes, one that loses the system
message fails the gate (a planted fault with its safe twin), and a template that refuses a system role is
probed without one and says so."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from support.manifests import real_manifest, write_manifest
from support.oracle_engine import reference_gate

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.gates.probes.template_probe import check_template

KEEPS = "{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
LOSES_SYSTEM = "{% for m in messages if m.role != 'system' %}<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
REFUSES_SYSTEM = (
    "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}\n{% endfor %}<assistant>"
)


def served_with(folder: Path, template: str) -> ServedModel:
    (folder / "chat.jinja").write_text(template)
    manifest = real_manifest("zoo:tiny-primary", preprocess={"chat_template": "chat.jinja"})
    manifest["quality"] = {"suites": [{"name": "arith", "dataset": "zoo:arith", "limit": 4, "public": True}]}
    return load_manifest(write_manifest(folder, manifest))


def test_a_template_that_keeps_every_message_is_measured_as_keeping_them(tmp_path: Path) -> None:
    check = check_template(served_with(tmp_path, KEEPS))
    assert check is not None and check.problem is None and check.how == "measured"
    assert "keeps every one of 4 messages (system, user, assistant, user)" in check.detail


def test_a_template_that_loses_the_system_message_is_named(tmp_path: Path) -> None:
    check = check_template(served_with(tmp_path, LOSES_SYSTEM))
    assert check is not None and check.problem == (
        "the chat template drops the system message 1 of a 4-message conversation"
    )


def test_a_template_that_refuses_a_system_role_is_probed_without_one(tmp_path: Path) -> None:
    check = check_template(served_with(tmp_path, REFUSES_SYSTEM))
    assert check is not None and check.problem is None and "refuses a system message" in check.detail


def test_nothing_is_rendered_under_chat_template_none(tmp_path: Path) -> None:
    served = load_manifest(write_manifest(tmp_path, real_manifest("zoo:tiny-primary")))
    assert check_template(served) is None


def contract(served: ServedModel, tmp_path: Path) -> Any:
    return reference_gate(served, tmp_path / "cache")


def test_the_contract_gate_fails_the_lossy_template_and_passes_its_safe_twin(tmp_path: Path) -> None:
    (tmp_path / "lossy").mkdir()
    (tmp_path / "safe").mkdir()
    lossy = contract(served_with(tmp_path / "lossy", LOSES_SYSTEM), tmp_path / "lossy")
    assert lossy.verdict == "fail" and "drops the system message" in lossy.reason, lossy.reason
    safe = contract(served_with(tmp_path / "safe", KEEPS), tmp_path / "safe")
    assert safe.verdict in ("pass", "warn"), safe.reason
    assert "keeps every one" in safe.measurements.checked["preprocess.chat_template"]


def test_nothing_is_checked_where_the_tokenizer_has_no_template(tmp_path: Path) -> None:
    manifest = real_manifest("zoo:tiny-primary", preprocess={"chat_template": "tokenizer"})
    assert check_template(load_manifest(write_manifest(tmp_path, manifest))) is None  # tiny-primary has none
