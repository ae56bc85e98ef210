"""Download the wheels the GPU machine's image lacks for servegate, within what one device run may carry.

    python3 scripts/gpu_wheels.py [--dest .gpu-wheels] [--python-version 3.12] [--limit-mib 64]

servegate's own requirements (pyproject.toml) are resolved for CPython 3.12 on manylinux x86-64 with pip's
resolver (`pip install --dry-run --report`, nothing installed), held to the image's known versions
(scripts/gpu_image_constraints.txt); every package of that resolution the image
already holds (scripts/gpu_image_packages.txt, plus torch, transformers, triton and the nvidia-* CUDA
libraries) is left out, and the rest is downloaded with `--no-deps`, pinned to the resolved version.
servegate's build requirements (setuptools, wheel and what they need) come along whole, on the image or not:
the GPU script builds servegate in pip's isolated build environment, which sees only the carried wheels.

The run fails (exit 1), listing every wheel and its size, when the wheels and the tracked working tree
together exceed --limit-mib: what a device run carries is the working tree plus the wheels, 64 MiB at most.
The folder also gets `carried.txt` (name==version, one a line: what the GPU script installs, exactly) and
`build.txt` (the build requirements, found there by pip's isolated build of servegate).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
ON_IMAGE_FILE = ROOT / "scripts" / "gpu_image_packages.txt"
IMAGE_VERSIONS_FILE = ROOT / "scripts" / "gpu_image_constraints.txt"
"""The image's versions where known: the resolution keeps to them (e.g. a datasets that takes its hub)."""
ALWAYS_ON_IMAGE = ("torch", "transformers", "triton")
"""Held by the image whatever its list says (with every nvidia-* package): never carried."""
PINS = ("torchao==0.18.0",)
"""torchao 0.18.0 is the release built against torch 2.11 (the image's): its kernels load there."""
BUILD_REQUIREMENTS = ("setuptools>=77", "wheel")
"""servegate's [build-system] requirements, carried for the isolated build of servegate itself."""
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28)] + ["manylinux2014_x86_64", "manylinux1_x86_64"]


def normalise(name: str) -> str:
    """A distribution name as pip compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    """The distribution name at the start of a requirement string."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"cannot read a package name from {requirement!r}")
    return normalise(match.group(1))


def on_image(path: Path = ON_IMAGE_FILE) -> set[str]:
    """Names of the packages the image holds."""
    names = {normalise(line.strip()) for line in path.read_text().splitlines() if line.strip()}
    return {n for n in names if not n.startswith("#")} | set(ALWAYS_ON_IMAGE)


def is_on_image(name: str, image: set[str]) -> bool:
    """Whether the image holds the package `name`."""
    return name in image or name.startswith("nvidia-")


def wanted_requirements(image: set[str]) -> list[str]:
    """servegate's requirements the image does not hold (torchao pinned)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = {requirement_name(p): p for p in PINS}
    wanted = [pinned.get(requirement_name(r), r) for r in project["dependencies"]]
    return [r for r in wanted if not is_on_image(requirement_name(r), image)]


def target_flags(python_version: str) -> list[str]:
    """pip flags that choose wheels for CPython `python_version` on manylinux x86-64."""
    abi = "cp" + python_version.replace(".", "")
    flags = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", "--abi", abi]
    for platform in PLATFORMS:
        flags += ["--platform", platform]
    return flags


def resolve(requirements: list[str], python_version: str, constraints: Path | None = None) -> dict[str, str]:
    """name -> version of every package pip's resolver picks for `requirements` on the target."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed"]
        command += ["--target", str(Path(scratch) / "unused"), "--report", str(report)]
        command += target_flags(python_version) + requirements
        if constraints is not None:
            command += ["--constraint", str(constraints)]
        subprocess.run(command, check=True)
        installs = json.loads(report.read_text())["install"]
    return {normalise(item["metadata"]["name"]): item["metadata"]["version"] for item in installs}


def download(runtime: dict[str, str], build: dict[str, str], dest: Path, python_version: str) -> None:
    """Download each pinned wheel (no dependencies) into `dest`, dropping wheels of anything else."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = {**runtime, **build}
    keep = {f"{name}=={version}" for name, version in pins.items()}
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(dest)]
    subprocess.run(command + target_flags(python_version) + sorted(keep), check=True)
    for wheel in dest.glob("*.whl"):
        name, version = wheel.name.split("-")[:2]
        if (normalise(name), version) not in set(pins.items()):
            wheel.unlink()
    for listing, chosen in (("carried.txt", runtime), ("build.txt", build)):
        (dest / listing).write_text("".join(f"{n}=={v}\n" for n, v in sorted(chosen.items())))


def tracked_tree_bytes() -> int:
    """Bytes of the files git tracks in this checkout (what a device run sends besides the wheels)."""
    listing = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    paths = [ROOT / p for p in listing.decode().split("\0") if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def main() -> int:
    """Resolve, download and size-check; 0 when everything fits, 1 when it does not."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".gpu-wheels")
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--limit-mib", type=float, default=64.0)
    parser.add_argument(
        "--image-versions",
        default=str(IMAGE_VERSIONS_FILE),
        help="constraints file of the image's versions; 'none' for a rehearsal on a venv of this machine's versions",
    )
    args = parser.parse_args()
    image = on_image()
    requirements = wanted_requirements(image)
    constraints = None if args.image_versions == "none" else Path(args.image_versions)
    resolved = resolve(requirements, args.python_version, constraints)
    runtime = {n: v for n, v in resolved.items() if not is_on_image(n, image)}
    build = resolve(list(BUILD_REQUIREMENTS), args.python_version)
    pins = {**runtime, **build}
    print(f"requirements the image lacks: {' '.join(requirements)}")
    print(f"left out (on the image): {' '.join(sorted(set(resolved) - set(runtime)))}")
    print(f"servegate's build requirements, carried whole: {' '.join(f'{n}=={v}' for n, v in sorted(build.items()))}")
    download(runtime, build, args.dest, args.python_version)
    wheels = sorted(args.dest.glob("*.whl"), key=lambda p: -p.stat().st_size)
    total = sum(w.stat().st_size for w in wheels)
    tree = tracked_tree_bytes()
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    mib = 2**20
    print(
        f"{len(wheels)} wheels, {total / mib:.2f} MiB; with the tracked tree ({tree / mib:.2f} MiB): "
        f"{(total + tree) / mib:.2f} MiB of the {args.limit_mib:g} MiB a device run carries"
    )
    if len(wheels) != len(pins):
        print(f"error: expected {len(pins)} wheels, found {len(wheels)} in {args.dest}", file=sys.stderr)
        return 1
    if total + tree > args.limit_mib * mib:
        print(
            f"error: {total / mib:.2f} MiB of wheels + {tree / mib:.2f} MiB of tree exceed {args.limit_mib:g} MiB: "
            "leave a package out (scripts/gpu_image_packages.txt) or carry it in a second run",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
