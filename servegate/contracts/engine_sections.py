"""The runtime's engine sections: which engine serves the model, how it is split, how servegate starts vLLM
and llama.cpp."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field, field_validator

from servegate.contracts.section_base import Section


class BackendQuestions:
    """What callers ask of `runtime.backend`, one property per question, so none compares the backend's name."""

    if TYPE_CHECKING:  # the field itself is Runtime's (pydantic must not see a second declaration)
        backend: str

    @property
    def remote(self) -> bool:
        """Whether the model runs in an engine servegate only talks to (endpoint, vLLM), not in its own."""
        return self.backend != "reference"

    @property
    def external(self) -> bool:
        """Whether the model runs on an endpoint servegate only connects to (backend: endpoint): someone else
        starts, sizes and stops its server."""
        return self.backend == "endpoint"

    @property
    def starts_vllm(self) -> bool:
        """Whether servegate starts a vLLM server of its own for the model (backend: vllm)."""
        return self.backend == "vllm"


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


class LlamaCppProcess(Section):
    """How servegate starts llama.cpp's `llama-server` for `runtime.backend: llamacpp`."""

    server: str | None = None
    """The `llama-server` binary. Unset: the SERVEGATE_LLAMACPP_SERVER environment variable, else
    `.venvs/llamacpp/bin/llama-server` (`make llamacpp`)."""
    host: str = "127.0.0.1"
    """Interface llama-server listens on (servegate talks to it there; clients go through servegate)."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port llama-server listens on (unset: a free one)."""
    startup_timeout_s: float = Field(default=300.0, gt=0, le=7200)
    """Seconds llama-server may take to report healthy and answer the warm-up prompts."""
    log_dir: str | None = None
    """Folder for llama-server's log (unset: .servegate-cache/llamacpp under the working directory)."""
    ubatch_size: int | None = Field(default=None, ge=1, le=1_000_000)
    """Physical micro-batch (`--ubatch-size`): tokens computed in one pass of a step (unset: the smaller of
    batching.max_num_batched_tokens and 512, llama.cpp's default)."""
    cache_reuse: int = Field(default=0, ge=0, le=1_000_000)
    """`--cache-reuse`: the shortest chunk of a cached prompt reused by shifting the KV cache (0: only a common
    prefix is reused). Needs runtime.kv_cache.prefix_caching."""
    extra_args: list[str] = Field(default_factory=list)
    """Further llama-server arguments, passed as given after the ones servegate maps from the manifest."""
    env: dict[str, str] = Field(default_factory=dict)
    """Further environment variables for llama-server."""

    @field_validator("extra_args")
    @classmethod
    def _no_mapped_args(cls, value: list[str]) -> list[str]:
        owned = {"-m", "--model", "--alias", "-a", "--host", "--port"}
        clash = sorted({a.split("=", 1)[0] for a in value} & owned)
        if clash:
            raise ValueError(f"extra_args cannot set {', '.join(clash)}: servegate sets them from the manifest")
        return value
