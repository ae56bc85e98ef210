"""The runtime's engine sections: which engine serves the model, how it is split, how servegate starts vLLM."""

from __future__ import annotations

from pydantic import Field, field_validator

from servegate.contracts.section_base import Section


class EngineIdentity(Section):
    """The serving engine behind a manifest, as declared or as the remote reported it at gate time."""

    name: str = Field(min_length=1, max_length=64)
    """Engine name as the remote reports it, e.g. `vllm` (`/version`) or `servegate`."""
    version: str | None = Field(default=None, max_length=64)
    """Engine version, e.g. `0.32.0`; a different version is different behaviour (it is fingerprinted)."""


class Parallelism(Section):
    """How the model is split across devices by an engine that can (vLLM); the reference backend runs on one."""

    tensor_parallel_size: int = Field(default=1, ge=1, le=1024)
    """Devices each layer's weights are split across (vLLM --tensor-parallel-size)."""
    pipeline_parallel_size: int = Field(default=1, ge=1, le=1024)
    """Stages the layers are split into, one device group each (vLLM --pipeline-parallel-size)."""
    data_parallel_size: int = Field(default=1, ge=1, le=1024)
    """Full copies of the model in one deployment, each serving its own requests (vLLM --data-parallel-size)."""


class VllmProcess(Section):
    """How servegate starts vLLM's OpenAI server for `runtime.backend: vllm`."""

    python: str | None = None
    """Interpreter that has vLLM installed (its own venv: vLLM pins its own transformers). Unset: the
    SERVEGATE_VLLM_PYTHON environment variable, else `.venvs/vllm/bin/python` (`make vllm-venv`)."""
    host: str = "127.0.0.1"
    """Interface vLLM listens on (servegate talks to it there; clients go through servegate)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port vLLM listens on (unset: a free one)."""
    startup_timeout_s: float = Field(default=600.0, gt=0, le=7200)
    """Seconds vLLM may take to answer the warm-up prompts (it loads, profiles and compiles first)."""
    log_dir: str | None = None
    """Folder for vLLM's log (unset: .servegate-cache/vllm under the working directory); its path is printed."""
    extra_args: list[str] = Field(default_factory=list)
    """Further vLLM engine arguments, passed as given after the ones servegate maps from the manifest."""
    env: dict[str, str] = Field(default_factory=dict)
    """Further environment variables for vLLM (e.g. VLLM_CPU_KVCACHE_SPACE)."""

    @field_validator("extra_args")
    @classmethod
    def _no_mapped_args(cls, value: list[str]) -> list[str]:
        owned = {"--model", "--served-model-name", "--host", "--port"}
        clash = sorted({a.split("=", 1)[0] for a in value} & owned)
        if clash:
            raise ValueError(f"extra_args cannot set {', '.join(clash)}: servegate sets them from the manifest")
        return value
