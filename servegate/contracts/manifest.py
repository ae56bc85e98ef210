"""The served-model manifest: the six elements plus quality, capacity and card, in one frozen model."""

from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from servegate.contracts.capacity_section import Capacity
from servegate.contracts.card_section import Card
from servegate.contracts.errors import ServegateError
from servegate.contracts.failure_section import FailurePolicy
from servegate.contracts.quality_section import Quality
from servegate.contracts.section_base import Section
from servegate.contracts.sections import (
    Batching,
    Postprocess,
    Preprocess,
    Runtime,
    Weights,
)

SIX_ELEMENTS = ("weights", "preprocess", "runtime", "batching", "postprocess", "failure_policy")
"""The manifest sections that decide behaviour; the fingerprint covers exactly these."""


class ServedModel(Section):
    """A served model: (weights, preprocess, runtime, batching, postprocess, failure policy)."""

    apiVersion: Literal["servegate/v1"] = "servegate/v1"  # noqa: N815 - the manifest's own key
    """Manifest format version."""
    kind: Literal["ServedModel"] = "ServedModel"
    """Manifest kind."""
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Name of the served model (letters, digits, '.', '_', '-'); reported as the API's model id."""
    version: str = Field(default="0.0.0", min_length=1, max_length=64)
    """Version of this serving configuration."""
    description: str = ""
    """Free text for humans."""
    weights: Weights
    """The checkpoint and how it is verified."""
    preprocess: Preprocess = Field(default_factory=Preprocess)
    """Request -> model input."""
    runtime: Runtime = Field(default_factory=Runtime)
    """How the model is executed."""
    batching: Batching = Field(default_factory=Batching)
    """How requests are grouped."""
    postprocess: Postprocess = Field(default_factory=Postprocess)
    """Model output -> response."""
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    """Deadlines, overload and fallback."""
    quality: Quality = Field(default_factory=Quality)
    """Eval suites and margins."""
    capacity: Capacity = Field(default_factory=Capacity)
    """Workload and targets."""
    card: Card = Field(default_factory=Card)
    """Public identity and observability statement."""

    _source: Path | None = PrivateAttr(default=None)
    _path_bases: dict[str, Path] = PrivateAttr(default_factory=dict)
    """Relative paths written in an included file of another folder -> that folder (contracts/loading.py)."""
    _parent: tuple[Weights, Path | None] | None = PrivateAttr(default=None)
    """The parent manifest's weights when `weights.derived_from` names one (read by contracts/loading.py)."""

    @model_validator(mode="after")
    def _cross_field_rules(self) -> ServedModel:
        pre, post, rt, bat = self.preprocess, self.postprocess, self.runtime, self.batching
        if pre.task == "generate":
            total = pre.max_input_tokens + post.max_output_tokens
            if total > rt.max_model_len:
                raise ValueError(
                    f"preprocess.max_input_tokens + postprocess.max_output_tokens ({total}) exceeds "
                    f"runtime.max_model_len ({rt.max_model_len}): lower one or raise max_model_len"
                )
        elif pre.max_input_tokens > rt.max_model_len:
            raise ValueError(
                f"preprocess.max_input_tokens ({pre.max_input_tokens}) exceeds runtime.max_model_len "
                f"({rt.max_model_len}): lower one or raise the other"
            )
        if bat.mode == "continuous" and rt.kv_cache is None and not rt.remote:
            raise ValueError("batching.mode=continuous needs runtime.kv_cache (block_size, memory_budget)")
        if bat.chunked_prefill and bat.mode != "continuous":
            raise ValueError(f"batching.chunked_prefill needs batching.mode=continuous (got {bat.mode})")
        if bat.mode == "continuous" and not bat.chunked_prefill and bat.max_num_batched_tokens < pre.max_input_tokens:
            raise ValueError(
                f"batching.max_num_batched_tokens ({bat.max_num_batched_tokens}) is smaller than "
                f"preprocess.max_input_tokens ({pre.max_input_tokens}), so a long prompt could never be "
                "scheduled: raise max_num_batched_tokens or set batching.chunked_prefill: true"
            )
        if pre.task == "embed" and bat.mode == "continuous":
            raise ValueError("task: embed runs with batching.mode none, static, dynamic or offline (not continuous)")
        if pre.task == "embed" and post.output_schema is not None:
            raise ValueError("postprocess.output_schema applies to generated text; remove it for task: embed")
        kv = rt.kv_cache
        if kv is not None and kv.prefix_caching and bat.mode != "continuous":
            raise ValueError(f"runtime.kv_cache.prefix_caching needs batching.mode=continuous (got {bat.mode})")
        if post.tools is not None and pre.chat_template == "none":
            raise ValueError("postprocess.tools needs a chat template that writes the tools into the prompt, not none")
        self._chat_suites_served()
        if self.weights.quantized_checkpoint and self.runtime.quantization.method != "none":
            raise ValueError(
                f"weights.format {self.weights.format} is already quantized, and runtime.quantization.method "
                f"{self.runtime.quantization.method} would quantize it again: set method: none"
            )
        if self.runtime.quantization.calibration is not None and self.runtime.quantization.method == "none":
            raise ValueError("runtime.quantization.calibration is set but method is none: remove it or pick a method")
        return self

    def _chat_suites_served(self) -> None:
        """Extraction and tools suites are chat requests with a schema or tools: the manifest must serve those."""
        pre, post = self.preprocess, self.postprocess
        for suite in self.quality.suites:
            where = f"quality.suites[{suite.name}] (kind: {suite.kind})"
            if suite.kind != "text" and pre.chat_template == "none":
                raise ValueError(f"{where} sends chat requests: it needs preprocess.chat_template, not none")
            structured = post.structured_output
            takes = structured is not None and structured.request_constraints and "json_schema" in structured.kinds
            if suite.kind == "extraction" and not takes:
                raise ValueError(f"{where} decodes under each item's schema: it needs postprocess.structured_output "
                                 "taking json_schema constraints from requests")  # fmt: skip
            if suite.kind == "tools" and post.tools is None:
                raise ValueError(f"{where} offers each item's tools: it needs postprocess.tools")

    # --- identity -------------------------------------------------------------------------------

    @property
    def source(self) -> Path | None:
        """The file this manifest was loaded from (None when built in code)."""
        return self._source

    @property
    def base_dir(self) -> Path:
        """Directory that relative paths in the manifest are resolved against."""
        return self._source.parent if self._source is not None else Path.cwd()

    def resolve_path(self, value: str) -> Path:
        """Resolve a path written in the manifest relative to the folder of the file that wrote it."""
        path = Path(value).expanduser()
        return path if path.is_absolute() else (self._path_bases.get(value, self.base_dir) / path)

    def six_elements(self) -> dict[str, Any]:
        """The canonical (JSON) form of the six behaviour-defining elements.

        An endpoint's URL says where the remote runs, not what it serves, so it is left out: moving the
        server to another port is the same behaviour; its engine and version (`runtime.engine`) are in.
        """
        data = self.model_dump(mode="json")
        data["runtime"].pop("endpoint_url", None)
        if data["runtime"].get("decode_attention") == "auto":  # the default: the fingerprints written before it stay
            data["runtime"].pop("decode_attention")
        if data["postprocess"].get("max_output_bytes") is None:  # unset: the fingerprints written before it stay
            data["postprocess"].pop("max_output_bytes", None)
        if data["postprocess"].get("tools") is None:  # likewise for manifests without tool calling
            data["postprocess"].pop("tools", None)
        if not data["preprocess"].get("template_fields"):  # and without template fields from requests
            data["preprocess"].pop("template_fields", None)
        for key in ("gguf_file", "derived_from"):  # and for weights that are not a toolchain's checkpoint
            if data["weights"].get(key) is None:
                data["weights"].pop(key, None)
        return {key: data[key] for key in SIX_ELEMENTS}

    @cached_property
    def fingerprint(self) -> str:
        """sha256 over the canonical six elements plus the weight checksums (cosmetic fields excluded)."""
        return fingerprint_of(self.six_elements())

    def with_changes(self, **sections: Any) -> ServedModel:
        """A validated copy with whole sections replaced (dicts or section models); keeps the source path."""
        data = self.model_dump(mode="python")
        for key, value in sections.items():
            data[key] = value.model_dump(mode="python") if isinstance(value, Section) else value
        copy = ServedModel.model_validate(data)
        copy._source, copy._path_bases = self._source, dict(self._path_bases)
        if copy.weights.derived_from == self.weights.derived_from:
            copy._parent = self._parent
        return copy

    def reference_form(self) -> ServedModel:
        """The same weights and suites with every optimization off: the baseline a manifest is gated against.

        No quantization, no prefix or response cache, batching `none`, no truncation (the full context
        the model can take), no fallback; the compute dtype stays as declared so only optimizations differ.
        A checkpoint that names the parent it was quantized from (`weights.derived_from`) is gated against
        that parent's weights.
        """
        rt = self.runtime.model_dump(mode="python")
        rt["quantization"] = {"method": "none"}
        if rt.get("kv_cache") is not None:
            rt["kv_cache"] = {**rt["kv_cache"], "prefix_caching": False, "dtype": "auto"}
        pre = {**self.preprocess.model_dump(mode="python"), "truncation": "reject"}
        pre["max_input_tokens"] = max(1, self.runtime.max_model_len - self.postprocess.max_output_tokens)
        post = self.postprocess.model_dump(mode="python")
        post["response_cache"] = {**post["response_cache"], "enabled": False}
        fail = {**self.failure_policy.model_dump(mode="python"), "fallback": None}
        batching = {"mode": "none", "max_batch_size": 1}
        # an endpoint is gated against servegate's own runtime on the same weights: the remote cannot be
        # asked to switch its optimizations off, so its reference form runs here
        rt.update(backend="reference", endpoint_url=None, endpoint_model=None, engine=None, vllm=None, llamacpp=None)
        form = self.with_changes(runtime=rt, preprocess=pre, postprocess=post, failure_policy=fail, batching=batching)
        return form if self.weights.derived_from is None else form.with_parent_weights()

    def parent_weights(self) -> tuple[Weights, Path | None]:
        """The weights `weights.derived_from` names, and the folder their relative source resolves against.

        A weights source is taken as written (a relative folder made absolute); a parent manifest is read when
        this manifest is loaded from its file (contracts/loading.py), so one built in code cannot name one.
        """
        derived_from = self.weights.derived_from
        if derived_from is None:
            raise ServegateError("weights.derived_from is not set: this checkpoint names no parent")
        if self.weights.derived_from_manifest:
            if self._parent is None:
                raise ServegateError(
                    f"weights.derived_from {derived_from} names a manifest, read only when this manifest is "
                    "loaded from its file: load it with contracts.loading.load_manifest"
                )
            return self._parent
        if derived_from.startswith(("zoo:", "hf:")):
            return Weights(source=derived_from), None
        return Weights(source=str(self.resolve_path(derived_from))), None

    def with_parent_weights(self) -> ServedModel:
        """A copy whose weights are the parent's that `weights.derived_from` names."""
        weights, folder = self.parent_weights()
        copy = self.with_changes(weights=weights)
        if folder is not None:  # the parent's relative source resolves against the parent manifest's folder
            copy._path_bases[weights.source] = folder
        return copy

    def with_engine(self, engine: dict[str, Any]) -> ServedModel:
        """A copy whose runtime.engine is `engine` (name, version): the identity a remote reported."""
        return self.with_changes(runtime={**self.runtime.model_dump(mode="python"), "engine": engine})


def fingerprint_of(six_elements: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of the six elements (sorted keys, no whitespace)."""
    canonical = json.dumps(six_elements, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
