"""`gate verify` probes the output features a manifest serves on a live servegate gateway (the zoo's tiny-primary):
a json_schema constraint and a named tool call pass where they are served, and a deployment that refuses what
the manifest declares is drift, named by its field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.drifting_remote import serve_app
from support.manifests import real_manifest, write_manifest

from servegate.contracts.loading import load_manifest
from servegate.contracts.manifest import ServedModel
from servegate.deploy.verify import verify_deployment
from servegate.server import create_app

pytest.importorskip("llguidance")

TEMPLATE = (
    "{%- if tools %}tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}assistant:"
)


def served_in(folder: Path, **post: Any) -> ServedModel:
    (folder / "tools.jinja").write_text(TEMPLATE)
    manifest = real_manifest(
        "zoo:tiny-primary",
        preprocess={"chat_template": "tools.jinja", "max_input_tokens": 64},
        runtime={"max_model_len": 160, "kv_cache": {"block_size": 16, "memory_budget": "4MiB"}},
        postprocess={"max_output_tokens": 64, "structured_output": {"whitespace": "compact"}, "tools": {}, **post},
    )
    return load_manifest(write_manifest(folder, manifest))


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with serve_app(create_app(served_in(tmp_path_factory.mktemp("outputs")))) as url:
        yield url


def checks_of(served: ServedModel, url: str) -> dict[str, Any]:
    return {c.name: c for c in verify_deployment(served, url).checks}


def test_the_served_constraint_and_tool_call_pass(gateway: str, tmp_path: Path) -> None:
    checks = checks_of(served_in(tmp_path), gateway)
    assert checks["postprocess.structured_output"].verdict == "pass", checks["postprocess.structured_output"].reason
    assert checks["postprocess.tools"].verdict == "pass", checks["postprocess.tools"].reason
    assert checks["postprocess.tools"].reason == "a named call parses and satisfies its schema"


def test_a_deployment_that_refuses_what_the_manifest_declares_drifts(tmp_path: Path) -> None:
    (tmp_path / "bare").mkdir()
    bare = served_in(tmp_path / "bare", structured_output=None, tools=None)
    with serve_app(create_app(bare)) as url:
        checks = checks_of(served_in(tmp_path), url)
    for field in ("postprocess.structured_output", "postprocess.tools"):
        assert checks[field].verdict == "fail" and "HTTP 400" in checks[field].reason, checks[field].reason
