"""A fresh venv on this CPU machine that holds what the GPU image holds and nothing more, to rehearse the GPU
check's install step here (`scripts/gpu_check.sh --cpu --python DEST/bin/python`).

    .venv/bin/python scripts/gpu_image_venv.py /tmp/gpu-image [--from .venv]

The new venv gets, linked from the --from venv's site-packages, only the distributions named in
scripts/gpu_image_packages.txt (torch, transformers, triton and nvidia-* included): every package servegate
needs beyond them must then come from the carried wheels, exactly as on the GPU machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import Distribution, distributions
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gpu_wheels import ROOT, is_on_image, normalise, on_image  # noqa: E402


def site_packages(venv: Path) -> Path:
    """The venv's site-packages folder."""
    (found,) = list((venv / "lib").glob("python3*/site-packages"))
    return found


def top_level_entries(dist: Distribution) -> set[str]:
    """First path components of every file the distribution installed (packages, modules, its dist-info)."""
    return {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}


def main() -> int:
    """Make the venv; prints what it linked and what it left out."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--from", dest="source", type=Path, default=ROOT / ".venv")
    args = parser.parse_args()
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(args.dest)], check=True)
    source, target = site_packages(args.source), site_packages(args.dest)
    image = on_image()
    linked, left_out = [], []
    for dist in distributions(path=[str(source)]):
        name = normalise(dist.metadata["Name"])
        if not is_on_image(name, image) or name in ("pip", "setuptools"):  # the new venv has its own pip
            left_out.append(name)
            continue
        for entry in top_level_entries(dist):
            link = target / entry
            if (source / entry).exists() and not link.exists():
                link.symlink_to(source / entry)
        linked.append(name)
    print(f"linked {len(linked)} distributions of the image: {' '.join(sorted(linked))}")
    print(f"left out {len(left_out)} (not on the image): {' '.join(sorted(left_out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
