"""`gate zoo list | path | build` through typer's CliRunner on the zoo app."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servegate.cli.zoo import app
from servegate.zoo import ZooError, zoo_model_path
from servegate.zoo import build as build_module
from servegate.zoo.catalog import sha256_file
from servegate.zoo.recipes import RECIPES

runner = CliRunner(env={"COLUMNS": "240"})  # wide enough that model names are never wrapped


def test_list_prints_a_table() -> None:
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0, result.output
    for name in ("tiny-primary", "tiny-fallback", "minilm", "causal-lm", "embedding"):
        assert name in result.stdout


def test_list_json_to_stdout_sends_the_table_to_stderr() -> None:
    result = runner.invoke(app, ["list", "--json", "-"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert "tiny-primary" in result.stderr
    models = {m["name"]: m for m in payload["models"]}
    primary = models["tiny-primary"]
    assert primary["kind"] == "causal-lm" and primary["available"] is True
    # The sha256 that `gate zoo list` reports is the sha256 of the file on disk.
    path = Path(primary["path"])
    for relative, digest in primary["files"].items():
        assert sha256_file(path / relative) == digest


def test_list_json_to_a_file(tmp_path: Path) -> None:
    target = tmp_path / "zoo.json"
    result = runner.invoke(app, ["list", "--json", str(target)])
    assert result.exit_code == 0
    assert {m["name"] for m in json.loads(target.read_text())["models"]} >= {"tiny-primary", "minilm"}


def test_path_prints_the_model_directory() -> None:
    result = runner.invoke(app, ["path", "tiny-primary"])
    assert result.exit_code == 0
    assert result.stdout.strip() == str(zoo_model_path("tiny-primary"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["path", "tiny-primery"], "did you mean 'tiny-primary'?"),
        (["path", "../../etc"], "invalid zoo model name"),
        (["build", "minilm"], "unknown zoo trainable model 'minilm'"),
        (["build", "tiny-primry"], "did you mean 'tiny-primary'?"),
        (["build", "tiny-primary", "--install", "--out", "x"], "drop --out or drop --install"),
    ],
)
def test_errors_are_one_line_and_exit_2(args: list[str], fragment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SERVEGATE_DEBUG", raising=False)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert fragment in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_debug_shows_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVEGATE_DEBUG", "1")
    result = runner.invoke(app, ["path", "nope"])
    assert isinstance(result.exception, ZooError)


def test_usage_error_exits_2() -> None:
    assert runner.invoke(app, ["path"]).exit_code == 2
    assert runner.invoke(app, ["frobnicate"]).exit_code == 2


def test_build_trains_saves_measures_and_prints_the_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A 3-step recipe and an 8-item measurement exercise the whole pipeline in seconds.
    tiny = dataclasses.replace(RECIPES["tiny-fallback"], steps=3, warmup_steps=1, batch_size=4)
    monkeypatch.setitem(RECIPES, "tiny-fallback", tiny)
    real_measure = build_module.measure
    monkeypatch.setattr(build_module, "measure", lambda model, tokenizer: real_measure(model, tokenizer, limit=8))
    out = tmp_path / "fb"
    result = runner.invoke(app, ["build", "tiny-fallback", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "training time" in result.stdout and "weights differ from the shipped ones" in result.stdout
    for name in ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "DATASHEET.md"):
        assert (out / name).is_file(), name
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["steps"] == 3 and metrics["items"]["arith"] == 8
