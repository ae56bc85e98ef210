"""benchmarks/process_exit.py alternates the two exits and reports each one's tail after the command returns."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_exits_are_timed_on_a_short_command() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "process_exit.py"), "--rounds", "2", "--", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    rounds = re.findall(r"^round (\d) (normal|fast) .*: exit tail [\d.]+ s, wall [\d.]+ s$", done.stdout, re.M)
    assert rounds == [("1", "normal"), ("1", "fast"), ("2", "normal"), ("2", "fast")]
    assert re.search(r"^normal exit tail [\d.]+ s \([\d.]+-[\d.]+\)", done.stdout, re.M)
    assert re.search(r"^saved per process: -?[\d.]+ s", done.stdout, re.M)
