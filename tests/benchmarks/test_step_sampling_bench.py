"""benchmarks/step_sampling.py times the step's sampling with and without logprobs asked, on the same rows."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_both_sides_are_timed_and_choose_the_same_tokens() -> None:
    command = [sys.executable, str(ROOT / "benchmarks" / "step_sampling.py"), "--rows", "4", "--vocab", "300"]
    done = subprocess.run(command + ["--rounds", "3"], capture_output=True, text=True, timeout=120, check=True)
    line = r"^(float32|bfloat16) +vocab 300 +(asked|quiet) +[\d.]+ ms \([\d.]+-[\d.]+\)$"
    sides = re.findall(line, done.stdout, re.M)
    assert sides == [("float32", "asked"), ("float32", "quiet"), ("bfloat16", "asked"), ("bfloat16", "quiet")]
    assert done.stdout.count("same tokens: True") == 2
