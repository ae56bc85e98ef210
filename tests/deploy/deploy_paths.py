"""Shared by the deploy tests: the golden-file switch and the manifests exported."""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).parents[2]
HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
QUICKSTART = ROOT / "examples/quickstart/manifest.yaml"
MULTIGPU = HERE / "manifests/multigpu.yaml"
LACKS = HERE / "manifests/vllm-lacks.yaml"


def regenerate_golden() -> bool:
    """SERVEGATE_REGEN_GOLDEN=1 rewrites tests/deploy/golden/ from the current export instead of comparing."""
    return os.environ.get("SERVEGATE_REGEN_GOLDEN") == "1"
