"""benchmarks/linear_kernels.py says which bfloat16 instructions the CPU lacks, instead of a silent slowdown."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def test_the_cpu_features_line_names_what_is_missing(tmp_path: Path) -> None:
    from linear_kernels import cpu_features

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n")
    assert cpu_features(info) == "CPU has avx512f, avx512_bf16, amx_bf16"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2\n")
    line = cpu_features(info)
    assert "lacks avx512_bf16, amx_bf16" in line and "without hardware support" in line
    assert cpu_features(tmp_path / "missing") == "CPU flags unreadable"
