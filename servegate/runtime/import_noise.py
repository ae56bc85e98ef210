"""Drop the warnings libraries print while importing that say nothing about the user's model or manifest.

torchao tries to load its CUDA-only kernel libraries (``_C_mxfp8``, ``_C_cutlass_90a``) on every import and
logs a warning for each on a machine without CUDA, where they cannot load by design; torch logs a
deprecation notice when torchao registers its Enum configs with pytree, addressed to torchao's
developers. Both would greet every `gate` command on a CPU machine. Everything else those loggers
say still gets through, and on a CUDA machine a kernel library that fails to load is still reported.
"""

from __future__ import annotations

import logging
import sys

TORCHAO_LOGGER = "torchao"
PYTREE_LOGGER = "torch.utils._pytree"


def _cuda_available() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


class ExpectedImportNoise(logging.Filter):
    """Refuses the two known import-time warnings; passes every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for torchao's kernel-library warning without CUDA and for pytree's Enum notice."""
        message = record.getMessage()
        if record.name == TORCHAO_LOGGER and message.startswith("Failed to load") and not _cuda_available():
            return False
        return not (record.name == PYTREE_LOGGER and "is an Enum subclass" in message)


def silence_import_noise() -> None:
    """Attach the filter to the two loggers (before torch or torchao is imported, or after: both work)."""
    noise = ExpectedImportNoise()
    for name in (TORCHAO_LOGGER, PYTREE_LOGGER):
        logger = logging.getLogger(name)
        if not any(isinstance(f, ExpectedImportNoise) for f in logger.filters):
            logger.addFilter(noise)
