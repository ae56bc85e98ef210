"""Test-wide settings: never reach a hub, keep Hugging Face caches and built kernels in temporary folders, one
torch thread.

One thread per process: the models in tests are tiny, and on a shared 2-core machine several
processes (pytest plus `gate serve` subprocesses) each asking for two threads stall every small
matrix multiply. Subprocesses inherit OMP_NUM_THREADS. It is also why `make test` runs one pytest-xdist
worker per CPU: one process leaves the other core idle. The workers inherit the folders set here by the process
that starts them, so they share one kernel folder, which is safe: a kernel is built beside its name and renamed.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="servegate-hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")
# the decode attention kernel is built once per session (a few seconds), not again in every test's own home
os.environ.setdefault("SERVEGATE_KERNELS", tempfile.mkdtemp(prefix="servegate-kernels-"))


def pytest_configure() -> None:
    """Pin torch to one thread when it is installed (every test environment has it)."""
    import torch

    torch.set_num_threads(1)
