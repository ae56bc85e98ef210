"""Build GGUF files of zoo:smollm2-135m-instruct with llama.cpp's own tools, as its users make them.

`make gguf-builds` runs it with servegate's interpreter (the converter needs torch, transformers, numpy and
safetensors, which are there) once `make llamacpp` has built the tools into .venvs/llamacpp:

    .venv/bin/python scripts/build_gguf.py --model "$(gate zoo path smollm2-135m-instruct)"

It imports nothing from servegate. The chain is the one llama.cpp documents: `convert_hf_to_gguf.py` turns the
model folder (safetensors, config.json, tokenizer) into an f16 GGUF, then `llama-quantize` makes each quantized
type from that f16 file. Each build is a folder `OUT/NAME/` holding one GGUF and `servegate-build.json`
(toolchain and version, the command, the source's sha256, the file's sha256, tensor types, seconds), which
servegate's checkpoint reader shows in `gate validate`, the quantization gate's report and the serving note.
A folder that already has its record is skipped unless --force; a build is written to `OUT/.NAME.partial` and
renamed when complete.

SmolLM2's hidden size is 576, which is not a multiple of the 256-weight super-blocks the K-quants need, so
llama-quantize gives every tensor whose rows are 576 long its fallback type (Q4_K -> Q5_0, Q5_K -> Q5_1,
Q6_K -> Q8_0, Q2_K and Q3_K -> Q4_0; it prints "using fallback quantization"). Only ffn_down (rows of 1536)
gets the K-quant itself. The record lists the tensor types the file really holds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_OUT = Path("examples/smollm2/gguf-builds")
DEFAULT_LLAMACPP = Path(".venvs/llamacpp")
BUILD_RECORD = "servegate-build.json"
STEM = "SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class Build:
    """One GGUF build: its folder, llama.cpp's type name, what it is made from, and why it is here."""

    name: str  # the folder under --out
    ftype: str  # llama-quantize's type (Q8_0, Q4_K_M, ...) or the converter's --outtype for the parent
    parent: str | None  # the build it is quantized from; None for the converter's output
    why: str  # what the build stands for in the gates
    extra: tuple[str, ...] = ()  # further llama-quantize options

    @property
    def file(self) -> str:
        """The GGUF's file name, in llama.cpp's usual MODEL-TYPE.gguf style."""
        return f"{STEM}-{self.ftype.upper()}.gguf"


BUILDS: dict[str, Build] = {
    build.name: build
    for build in (
        Build("f16", "f16", None, "the parent: the zoo's float32 safetensors converted to a 16-bit GGUF"),
        Build("q8_0", "Q8_0", "f16", "good: 8-bit blocks of 32, the near-lossless llama.cpp build"),
        Build("q5_k_m", "Q5_K_M", "f16", "the usual 5-bit mix (Q5_1 where the rows are 576 long, Q6_K/Q5_K elsewhere)"),
        Build("q4_k_m", "Q4_K_M", "f16", "the usual 4-bit mix, the most downloaded llama.cpp build"),
        Build(
            "q2_k",
            "Q2_K",
            "f16",
            "bad on purpose: the 2-bit mix, the smallest file llama-quantize makes without an importance matrix",
        ),
    )
}


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def tensor_types(path: Path, gguf_py: Path) -> dict[str, int]:
    """Each GGUF tensor type in the file with its count, read by the vendored gguf package."""
    sys.path.insert(0, str(gguf_py))
    try:
        import gguf
    finally:
        sys.path.remove(str(gguf_py))
    counts: dict[str, int] = {}
    for tensor in gguf.GGUFReader(path).tensors:
        counts[tensor.tensor_type.name] = counts.get(tensor.tensor_type.name, 0) + 1
    return dict(sorted(counts.items()))


def llamacpp_version(llamacpp: Path) -> str:
    """`llama-server --version`'s first line (e.g. "version: 0.5.0-dev (build 1, commit 0c1e570)")."""
    done = subprocess.run([str(llamacpp / "bin" / "llama-server"), "--version"], capture_output=True, text=True)
    lines = (done.stdout + done.stderr).strip().splitlines()
    return lines[0].removeprefix("version: ") if lines else "unknown"


def run_logged(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run a tool with its output in `log`; on failure, exit with the log's last lines."""
    with log.open("w", encoding="utf-8") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    if done.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:])
        raise SystemExit(f"{command[0]} failed (exit {done.returncode}), log {log}:\n{tail}")


def build_one(build: Build, model_dir: Path, out: Path, llamacpp: Path, python: str) -> float:
    """Make one GGUF (convert or quantize), write its record, and return the seconds it took."""
    started = time.monotonic()
    partial = out / f".{build.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    target = partial / build.file
    convert = llamacpp / "convert"
    if build.parent is None:
        source = model_dir / "model.safetensors"
        command = [python, str(convert / "convert_hf_to_gguf.py"), str(model_dir), "--outtype", build.ftype,
                   "--outfile", str(target)]  # fmt: skip
        # the vendored gguf-py first: the converter and its writer must be the same llama.cpp revision
        path = os.pathsep.join([str(convert / "gguf-py"), str(convert / "site")])
        env = {**os.environ, "PYTHONPATH": path}
        shown = ["convert_hf_to_gguf.py", model_dir.name, "--outtype", build.ftype, "--outfile", build.file]
    else:
        parent = BUILDS[build.parent]
        source = out / parent.name / parent.file
        command = [str(llamacpp / "bin" / "llama-quantize"), *build.extra, str(source), str(target), build.ftype]
        env = None
        shown = ["llama-quantize", *build.extra, parent.file, build.file, build.ftype]
    run_logged(command, partial / "build.log", env)
    seconds = time.monotonic() - started
    record = {
        "toolchain": "llama.cpp",
        "toolchain_version": llamacpp_version(llamacpp),
        "built_from": _built_from(llamacpp),
        "name": build.name,
        "file": build.file,
        "type": build.ftype.upper(),
        "purpose": build.why,
        "command": " ".join(shown),
        "source": {"file": source.name, "folder": source.parent.name, "sha256": sha256_file(source)},
        "sha256": sha256_file(target),
        "bytes": target.stat().st_size,
        "tensor_types": tensor_types(target, convert / "gguf-py"),
        "seconds": round(seconds, 1),
    }
    (partial / BUILD_RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(out / build.name, ignore_errors=True)
    partial.rename(out / build.name)
    return seconds


def _built_from(llamacpp: Path) -> str:
    """What scripts/build_llamacpp.sh built the tools from (its BUILD-INFO.json), or a note that it is absent."""
    info = llamacpp / "BUILD-INFO.json"
    if not info.is_file():
        return "tools not built by make llamacpp (no BUILD-INFO.json)"
    data = json.loads(info.read_text(encoding="utf-8"))
    return f"{data['package']} {data['version']} sdist (sha256 {data['sdist_sha256']}), {data['cmake_flags']}"


def main(argv: list[str] | None = None) -> int:
    """Build the requested GGUFs (all by default, parent first), then print a table of size and build time."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the zoo model folder (gate zoo path NAME)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"where builds go (default {DEFAULT_OUT})")
    parser.add_argument("--llamacpp", type=Path, default=DEFAULT_LLAMACPP, help="what `make llamacpp` built")
    parser.add_argument("--only", action="append", choices=sorted(BUILDS), help="build only NAME (repeatable)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs the converter")
    parser.add_argument("--force", action="store_true", help="rebuild folders that are already built")
    args = parser.parse_args(argv)
    if not (args.model / "model.safetensors").is_file():
        parser.error(f"{args.model}/model.safetensors does not exist: run `make fetch`")
    for tool in ("bin/llama-quantize", "convert/convert_hf_to_gguf.py"):
        if not (args.llamacpp / tool).is_file():
            parser.error(f"{args.llamacpp / tool} does not exist: run `make llamacpp`")
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = set(args.only or BUILDS)
    rows = []
    for name, build in BUILDS.items():  # in order: the parent before the builds made from it
        if name not in wanted:
            continue
        folder = args.out / name
        if (folder / BUILD_RECORD).is_file() and not args.force:
            seconds = json.loads((folder / BUILD_RECORD).read_text(encoding="utf-8"))["seconds"]
            print(f"[gguf {name}] already built in {folder} (--force rebuilds it)", flush=True)
            rows.append((name, folder / build.file, seconds, "kept"))
            continue
        if build.parent is not None and not (args.out / build.parent / BUILD_RECORD).is_file():
            parser.error(f"{name} is quantized from {build.parent}, which is not built: build it first")
        print(f"[gguf {name}] building {build.file} ...", flush=True)
        seconds = build_one(build, args.model, args.out, args.llamacpp, args.python)
        print(f"[gguf {name}] done in {seconds:.1f} s -> {folder}", flush=True)
        rows.append((name, folder / build.file, seconds, "built"))
    print(f"\n{'build':<8} {'MiB':>7} {'seconds':>8}")
    for name, path, seconds, state in rows:
        print(f"{name:<8} {path.stat().st_size / (1 << 20):>7.1f} {seconds:>8.1f}  {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
