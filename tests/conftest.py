"""Test-wide settings: never reach a hub, keep Hugging Face caches in a temporary folder."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="servegate-hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
