"""`gate` commands do not greet CPU users with torchao's CUDA-kernel and pytree import warnings."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from servegate.runtime.import_noise import PYTREE_LOGGER, TORCHAO_LOGGER, ExpectedImportNoise

IMPORT_TORCHAO = "import torch, torchao.quantization"
SILENCED = "from servegate.runtime.import_noise import silence_import_noise; silence_import_noise(); " + IMPORT_TORCHAO


def _record(name: str, message: str, level: int = logging.WARNING) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_the_filter_drops_only_the_two_known_warnings() -> None:
    noise = ExpectedImportNoise()
    torch_cuda = pytest.importorskip("torch").cuda.is_available()
    assert noise.filter(_record(TORCHAO_LOGGER, "Failed to load /x/_C_mxfp8.so: nope")) is torch_cuda
    assert not noise.filter(_record(PYTREE_LOGGER, "<enum 'X'> is an Enum subclass and is now natively supported"))
    assert noise.filter(_record(TORCHAO_LOGGER, "Skipping import of cpp extensions"))
    assert noise.filter(_record(PYTREE_LOGGER, "something else"))
    assert noise.filter(_record("servegate.server", "Failed to load the model"))


def _stderr(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    return done.stderr


@pytest.mark.skipif(pytest.importorskip("torch").cuda.is_available(), reason="on CUDA the kernels load")
def test_importing_torchao_after_silencing_prints_neither_warning() -> None:
    plain = _stderr(IMPORT_TORCHAO)
    if "Failed to load" not in plain and "Enum subclass" not in plain:
        pytest.skip("this torchao build prints neither warning")
    silenced = _stderr(SILENCED)
    assert "Failed to load" not in silenced
    assert "Enum subclass" not in silenced
