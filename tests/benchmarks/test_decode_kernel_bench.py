"""benchmarks/decode_kernel_bench.py builds the kernel as it was at a git revision and times the same inputs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_kernel_at_head_is_built_apart_and_agrees_with_the_runtimes(tmp_path: Path) -> None:
    from decode_kernel_bench import case, kernel_at, run

    from servegate.runtime.model.decode_kernel import load_decode_kernel

    at_head = kernel_at("HEAD", tmp_path)
    assert at_head.path.parent == tmp_path and at_head.path.is_file()
    q, pools, table, lengths, first, block = case(3, 2, 3, torch.float32)
    inputs = (q, table, lengths, first, block)
    ours, theirs = (run(kernel, pools[:2], inputs) for kernel in (load_decode_kernel(), at_head))
    assert len(ours) == 2 and ours[0].shape == (3, 2, 3, 64)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_a_revision_git_does_not_know_is_one_line(tmp_path: Path) -> None:
    from decode_kernel_bench import kernel_at

    with pytest.raises(SystemExit, match="cannot read .*decode_attention.c at no-such-revision"):
        kernel_at("no-such-revision", tmp_path)
