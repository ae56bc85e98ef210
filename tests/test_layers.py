"""scripts/layers.py: the layer rule of docs/architecture.md, on a planted package and on servegate itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "layers.py"


def layers(package: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the layers check on a package directory."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(package), *args], capture_output=True, text=True, check=False, cwd=ROOT
    )


def plant(root: Path, files: dict[str, str]) -> Path:
    """A package `fake` under root, holding the given files (every folder gets an __init__.py)."""
    for name, text in files.items():
        path = root / "fake" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for folder in [root / "fake", *(p for p in (root / "fake").rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    return root / "fake"


def test_a_clean_package_has_no_finding(tmp_path: Path) -> None:
    package = plant(tmp_path, {"low/a.py": "X = 1\n", "high/b.py": "from fake.low.a import X\n"})
    run = layers(package, "--order", "low <- high")
    assert run.returncode == 0, run.stdout
    assert run.stdout.splitlines()[0] == "upward imports: 0; file circles: 0; package cycles: 0; long modules: 0"


def test_an_upward_import_is_found(tmp_path: Path) -> None:
    package = plant(
        tmp_path,
        {"low/a.py": "def f():\n    from fake.high.b import Y\n", "high/b.py": "from ..low.a import f\nY = 2\n"},
    )
    run = layers(package, "--order", "low <- high")
    assert run.returncode == 1
    assert "upward imports: 1;" in run.stdout
    assert "upward imports: fake.low.a -> fake.high.b" in run.stdout
    assert "file circles: 1;" in run.stdout  # a.py and b.py import each other


def test_a_package_cycle_no_file_circle_shows_is_found(tmp_path: Path) -> None:
    # engine/a -> scheduling/b -> engine/c: no two files import each other, the two subpackages do.
    package = plant(
        tmp_path,
        {
            "runtime/engine/a.py": "from fake.runtime.scheduling.b import B\n",
            "runtime/engine/c.py": "C = 3\n",
            "runtime/scheduling/b.py": "from fake.runtime.engine.c import C\nB = C\n",
            "runtime/types.py": "T = 0\n",
        },
    )
    run = layers(package, "--order", "runtime <- cli")
    assert run.returncode == 1
    assert run.stdout.splitlines()[0] == "upward imports: 0; file circles: 0; package cycles: 1; long modules: 0"
    assert "package cycles: fake.runtime.engine <-> fake.runtime.scheduling" in run.stdout
    assert "scheduling -> engine (fake.runtime.scheduling.b -> fake.runtime.engine.c)" in run.stdout


def test_a_long_module_is_found(tmp_path: Path) -> None:
    package = plant(tmp_path, {"low/big.py": "X = 1\n" * 12})
    run = layers(package, "--order", "low <- high", "--max-lines", "10")
    assert run.returncode == 1
    assert "long modules: fake.low.big (12 lines)" in run.stdout


def test_servegate_keeps_its_layers() -> None:
    run = layers(ROOT / "servegate")
    assert run.stdout.splitlines()[0] == "upward imports: 0; file circles: 0; package cycles: 0; long modules: 0", (
        run.stdout
    )
    assert run.returncode == 0


def test_the_runtime_types_import_nothing_from_the_runtime() -> None:
    tree = ast.parse((ROOT / "servegate" / "runtime" / "types.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert imported and not [name for name in imported if name.startswith("servegate.runtime")]
