"""The engine the reliability tests run: the one `gate serve` builds, over a small real causal LM.

The model is the zoo's `tiny-primary` when it is built, else a random 2-layer Llama saved to a folder
with the zoo's character tokenizer. The engine is `servegate.runtime.build(served)`: weight loading
with checksums, preprocess, the scheduler, paged KV blocks, prefix and response caches, the failure
policy. `step_delay_s` makes every model step take that much longer (a bigger model on this CPU)
without using a core, so overload is reached at a request rate a Python client on two shared cores
can send.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from support.manifests import merged_manifest
from support.models import save_tiny_llama

from servegate.contracts.manifest import ServedModel

MODEL_NAME = "reliable"


def zoo_primary() -> Path | None:
    """The zoo's tiny-primary directory, or None while it is not built."""
    try:
        from servegate.zoo import zoo_model_path

        return zoo_model_path("tiny-primary")
    except Exception:  # not built yet, or the zoo package is not importable
        return None


def model_source(folder: Path) -> str:
    """`zoo:tiny-primary` when built, else the path of a random tiny Llama saved under `folder`."""
    return "zoo:tiny-primary" if zoo_primary() is not None else str(save_tiny_llama(folder / "tiny-llama"))


def manifest_data(source: str, **sections: Any) -> dict[str, Any]:
    """A manifest for the tiny model; `sections` are merged over the defaults (one level deep)."""
    data: dict[str, Any] = {
        "apiVersion": "servegate/v1",
        "kind": "ServedModel",
        "name": MODEL_NAME,
        "weights": {"source": source},
        "preprocess": {"chat_template": "none", "max_input_tokens": 96, "max_payload_bytes": 16384},
        "runtime": {
            "device": "cpu",
            "dtype": "float32",
            "max_model_len": 128,
            "threads": 1,
            "kv_cache": {"block_size": 8, "memory_budget": "2MiB"},
        },
        "batching": {"mode": "continuous", "max_batch_size": 8, "max_num_batched_tokens": 256},
        "postprocess": {"max_output_tokens": 32, "logprobs": True},
    }
    return merged_manifest(data, **sections)


def model_dir_of(served: ServedModel) -> Path:
    """The directory the manifest's weights come from."""
    source = served.weights.source
    if source.startswith("zoo:"):
        from servegate.zoo import zoo_model_path

        return zoo_model_path(source.removeprefix("zoo:"))
    return served.resolve_path(source)


# --- engines --------------------------------------------------------------------------------------------


class SlowRunner:
    """A model runner whose steps take longer: `delay_s` per step plus `per_token_s` per token computed.

    It sleeps (no core is used). The per-token part gives a step the cost structure of a bigger model,
    where a prompt served from the prefix cache is measurably faster than one computed in full.
    """

    def __init__(self, inner: Any, delay_s: float, per_token_s: float = 0.0) -> None:
        self.inner = inner
        self.delay_s = delay_s
        self.per_token_s = per_token_s

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def execute(self, chunks: Sequence[Any]) -> Any:
        """Sleep, then run the real step."""
        time.sleep(self.delay_s + self.per_token_s * sum(len(c.token_ids) for c in chunks))
        return self.inner.execute(chunks)


def reference_engine(served: ServedModel, *, step_delay_s: float = 0.0, per_token_s: float = 0.0) -> Any:
    """The (not yet started) engine `gate serve` builds for the manifest; its steps slowed as SlowRunner says."""
    from servegate.runtime import build

    if step_delay_s <= 0 and per_token_s <= 0:
        return build(served)
    from servegate.runtime.engine.parts import build_parts
    from servegate.runtime.engine.reference import ReferenceEngine

    parts = build_parts(served)
    return ReferenceEngine(
        served,
        runner=SlowRunner(parts.runner, step_delay_s, per_token_s),
        tokenizer=parts.tokenizer,
        preprocessor=parts.preprocessor,
        sampler=parts.sampler,
    )


def rss_bytes(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), from /proc."""
    status = Path(f"/proc/{pid or os.getpid()}/status").read_text(encoding="utf-8")
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc status")
