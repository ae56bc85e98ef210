"""What a quantized checkpoint says about itself, read from its files before any weight is loaded.

A toolchain checkpoint carries its own scheme: llm-compressor writes a `quantization_config` (compressed-tensors)
into config.json, llama.cpp writes the file type and each tensor's type into the GGUF header. servegate reads
those, so the gates and the serving note report the scheme the build really has (not what a manifest claims),
refuses a scheme its runtime cannot run before a model loads, and tells a candidate whose architecture is not
its parent's from one that only quantized it.

How the reference runtime runs each format (`executed_as` in every report):
- compressed-tensors: the weights are dequantized once at load (compressed-tensors' own decompressors, through
  transformers) and run in the compute dtype; int8 or fp8 activations declared dynamic per token are rounded
  per token before every quantized linear layer, as the scheme's kernels would see them.
- gguf: transformers' GGUF reader dequantizes every tensor to float32 once per file (the `gguf` package's
  dequantizers); the result is kept as safetensors and loaded from there (runtime/model/gguf_kept.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servegate.contracts.errors import ServegateError

RUNNABLE_CT_FORMATS = ("pack-quantized", "int-quantized", "naive-quantized", "float-quantized")
"""compressed-tensors storage formats whose decompressors turn the weights back into dense tensors on CPU."""
BUILD_RECORD = "servegate-build.json"
"""What `make checkpoints` (scripts/build_checkpoints.py) writes beside a build: toolchain, recipe, calibration."""
UNQUANTIZED_GGUF_TYPES = ("F32", "F16", "BF16")
"""GGUF tensor (and file) types that hold plain floats: a GGUF of only these can be a quantized build's parent."""
ARCHITECTURE_KEYS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
)
"""config.json keys that must agree between a quantized checkpoint and its parent."""


@dataclass(frozen=True)
class CheckpointScheme:
    """A checkpoint's quantization as its own files record it."""

    format: str
    """weights.format: safetensors, pickle, compressed-tensors or gguf."""
    scheme: str
    """Short name: W4A16, W8A8, W8A8-FP8 (compressed-tensors), Q4_K_M, Q8_0 (GGUF file type), or none."""
    weight_bits: int | None = None
    """Bits per quantized weight (the most common tensor type's, for a GGUF)."""
    group_size: int | None = None
    """Weights per quantization group; None for per-channel or per-tensor scales."""
    strategy: str | None = None
    """How weight scales are shared: group, channel, tensor, block (compressed-tensors), or the GGUF block type."""
    activations: str | None = None
    """How activations are quantized ("int8 dynamic per token"), or None when they stay in the compute dtype."""
    storage: str | None = None
    """The on-disk encoding: a compressed-tensors format (pack-quantized, ...) or the GGUF tensor types with counts."""
    targets: tuple[str, ...] = ()
    """What the quantized config groups name: layer classes, module names or `re:` patterns (compressed-tensors)."""
    ignored: tuple[str, ...] = ()
    """Layers the scheme leaves unquantized (e.g. lm_head)."""
    toolchain: str | None = None
    """What made the checkpoint, with its version where recorded (llm-compressor 0.14.0.1, llama.cpp)."""
    calibration: dict[str, Any] | None = None
    """The calibration set the toolchain recorded (file, sha256, samples), or None when the files do not say."""
    recipe: str | None = None
    """The toolchain's recipe as it saved it (llm-compressor's recipe.yaml), when present."""
    executed_as: str = "as stored"
    """How servegate's reference runtime runs it (dequantized at load, activations simulated, ...)."""
    notes: tuple[str, ...] = field(default=())
    """Anything else a reader of the report should know about this build."""

    @property
    def quantized(self) -> bool:
        """Whether the files hold quantized weights (False for plain formats and for an F16, BF16 or F32 GGUF)."""
        return self.scheme != "none" and self.scheme not in UNQUANTIZED_GGUF_TYPES

    def summary(self) -> str:
        """One line for tables: scheme, groups, toolchain and calibration."""
        parts = [f"{self.format} {self.scheme}"]
        if self.format == "gguf" and self.storage:  # a llama.cpp file type names a mix: say what the tensors hold
            held = [t for t in self.storage.split(", ") if t.split(" ")[0] not in UNQUANTIZED_GGUF_TYPES]
            parts[0] += f" ({', '.join(held) if held else self.storage})"
        if self.group_size:
            parts.append(f"group {self.group_size}")
        if self.activations:
            parts.append(f"activations {self.activations}")
        if self.toolchain:
            parts.append(f"by {self.toolchain}")
        calibration = self.calibration or {}
        if calibration.get("file"):
            parts.append(f"calibrated on {calibration['file']} ({calibration.get('samples', '?')} samples)")
        return ", ".join(parts)


def read_scheme(directory: Path, weights_format: str, gguf_file: str | None = None) -> CheckpointScheme:
    """The scheme of the checkpoint in `directory`; a ServegateError naming the file and the fix when the
    runtime cannot run it."""
    if weights_format == "compressed-tensors":
        return _compressed_tensors_scheme(directory)
    if weights_format == "gguf":
        return _gguf_scheme(gguf_path(directory, gguf_file))
    _no_other_quantization(directory, weights_format)
    return CheckpointScheme(format=weights_format, scheme="none")


def _no_other_quantization(directory: Path, weights_format: str) -> None:
    """A plain folder whose config.json declares a quantization servegate does not run (AutoGPTQ, AutoAWQ,
    bitsandbytes, ...) is refused by name, instead of failing inside transformers for want of a kernel package."""
    path = directory / "config.json"
    if not path.is_file():
        return
    quant = _read_config(directory).get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method is None:
        return
    if method == "compressed-tensors":
        raise ServegateError(f"{path}: the checkpoint is compressed-tensors: set weights.format: compressed-tensors")
    raise ServegateError(
        f"{path}: weights.format is {weights_format} but the checkpoint is quantized with {method}, which servegate's "
        "runtime does not load (it runs compressed-tensors and GGUF checkpoints): export it as compressed-tensors "
        "(llm-compressor writes GPTQ and AWQ schemes in that format) and set weights.format: compressed-tensors"
    )


# --- compressed-tensors ------------------------------------------------------------------------------------


def _read_config(directory: Path) -> dict[str, Any]:
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ServegateError(f"{path} is missing: the checkpoint folder needs its config.json") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ServegateError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ServegateError(f"{path} is not a JSON object")
    return data


def _compressed_tensors_scheme(directory: Path) -> CheckpointScheme:
    config_path = directory / "config.json"
    quant: Any = _read_config(directory).get("quantization_config")  # a dict once quant_method is checked
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method != "compressed-tensors":
        raise ServegateError(
            f"{config_path}: weights.format is compressed-tensors but its quantization_config is "
            f"{'absent' if quant is None else f'quant_method {method!r}'}: point weights.source at the folder "
            "llm-compressor saved with save_compressed=True, or set weights.format to what the folder holds"
        )
    storage = str(quant.get("format") or "")
    groups = quant.get("config_groups") or {}
    if not groups:
        raise ServegateError(f"{config_path}: quantization_config has no config_groups: nothing is quantized")
    formats = {str(g.get("format") or storage) for g in groups.values()}
    unrunnable = sorted(f for f in formats if f not in RUNNABLE_CT_FORMATS)
    if unrunnable:
        raise ServegateError(
            f"{config_path}: compressed-tensors format {', '.join(unrunnable)} is not one servegate's runtime can "
            f"run (it dequantizes {', '.join(RUNNABLE_CT_FORMATS)}): rebuild the checkpoint in one of those"
        )
    if quant.get("kv_cache_scheme"):
        raise ServegateError(
            f"{config_path}: a quantized KV cache (kv_cache_scheme) is not run by servegate's runtime: build the "
            "checkpoint without it, or declare runtime.kv_cache.dtype: fp8 on the unquantized parent instead"
        )
    name, first = sorted(groups.items())[0]
    weights = first.get("weights") or {}
    if len(groups) > 1:
        differs = [n for n, g in groups.items() if (g.get("weights") or {}) != weights]
        if differs:
            raise ServegateError(
                f"{config_path}: config groups {name} and {differs[0]} quantize weights differently; servegate "
                "reports one scheme per checkpoint: build it with one weight scheme"
            )
    activations = _activation_rule(config_path, first.get("input_activations"))
    bits = int(weights.get("num_bits", 0)) or None
    kind = str(weights.get("type", "int"))
    act_bits = 16 if activations is None else int(first["input_activations"]["num_bits"])
    label = f"W{bits}A{act_bits}" + ("-FP8" if kind == "float" else "")
    build = _build_record(directory)
    recipe_path = directory / "recipe.yaml"
    toolchain = None
    if build.get("toolchain"):
        toolchain = f"{build['toolchain']} {build.get('toolchain_version', '')}".strip()
    elif recipe_path.is_file():
        toolchain = "llm-compressor (recipe.yaml; version not recorded)"
    executed = "weights dequantized once at load by compressed-tensors, computed in the runtime dtype"
    if activations is not None:
        executed += f"; activations rounded to {activations} before each quantized layer (simulated)"
    return CheckpointScheme(
        format="compressed-tensors",
        scheme=label,
        weight_bits=bits,
        group_size=weights.get("group_size") if weights.get("strategy") == "group" else None,
        strategy=weights.get("strategy"),
        activations=activations,
        storage=storage or ", ".join(sorted(formats)),
        targets=tuple(sorted({t for group in groups.values() for t in group.get("targets", [])})),
        ignored=tuple(quant.get("ignore") or ()),
        toolchain=toolchain,
        calibration=build.get("calibration"),
        recipe=recipe_path.read_text(encoding="utf-8") if recipe_path.is_file() else _recipe_text(build),
        executed_as=executed,
        notes=(f"compressed-tensors {quant.get('version', '?')} wrote the checkpoint",),
    )


def _activation_rule(config_path: Path, args: dict[str, Any] | None) -> str | None:
    """The activation quantization the runtime simulates, or a ServegateError for one it cannot."""
    if not args:
        return None
    bits, kind = int(args.get("num_bits", 0)), str(args.get("type", "int"))
    dynamic, strategy = args.get("dynamic"), args.get("strategy")
    if dynamic is True and strategy == "token" and (bits, kind) in ((8, "int"), (8, "float")):
        return f"{'int8' if kind == 'int' else 'fp8'} dynamic per token"
    raise ServegateError(
        f"{config_path}: input activations {kind}{bits} ({'dynamic' if dynamic else 'static'}, strategy "
        f"{strategy}) are not simulated by servegate's runtime (it runs int8 or fp8 dynamic per token, or none): "
        "build the checkpoint with one of those"
    )


def _build_record(directory: Path) -> dict[str, Any]:
    path = directory / BUILD_RECORD
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ServegateError(f"cannot read {path}: {exc}: rebuild the checkpoint (make checkpoints)") from None
    return data if isinstance(data, dict) else {}


def _recipe_text(build: dict[str, Any]) -> str | None:
    recipe = build.get("recipe")
    if recipe is None or isinstance(recipe, str):
        return recipe
    return json.dumps(recipe, indent=2, sort_keys=True)


# --- GGUF --------------------------------------------------------------------------------------------------


def gguf_path(directory: Path, gguf_file: str | None) -> Path:
    """The GGUF file a manifest names (weights.gguf_file), or the folder's only one."""
    if gguf_file is not None:
        path = directory / gguf_file
        if not path.is_file():
            present = sorted(p.name for p in directory.glob("*.gguf"))
            raise ServegateError(
                f"weights.gguf_file {gguf_file}: no such file in {directory} (it holds "
                f"{', '.join(present) if present else 'no .gguf file'}); for the zoo's SmolLM2, run "
                "`gate zoo fetch smollm2-135m-instruct --force` to keep its GGUF beside the conversion"
            )
        return path
    found = sorted(directory.glob("*.gguf"))
    if len(found) != 1:
        raise ServegateError(
            f"{directory} holds {len(found)} .gguf files ({', '.join(p.name for p in found) or 'none'}): name one "
            "with weights.gguf_file"
        )
    return found[0]


def _gguf_scheme(path: Path) -> CheckpointScheme:
    from servegate.runtime.model.gguf_kept import gguf_fields

    header = gguf_fields(path)
    try:
        import gguf
        from gguf.quants import _type_traits  # the dequantizers the gguf package has
    except ImportError:
        raise ServegateError(f"reading {path.name} needs the gguf package: pip install 'servegate[real]'") from None
    counts = header.tensor_types
    plain = UNQUANTIZED_GGUF_TYPES
    unknown = sorted(t for t in counts if t not in plain and gguf.GGMLQuantizationType[t] not in _type_traits)
    if unknown:
        raise ServegateError(
            f"{path}: GGUF tensor type {', '.join(unknown)} has no dequantizer in the gguf package, so the reference "
            "runtime cannot run this file: requantize it to a known type (e.g. Q8_0, Q4_K_M)"
        )
    label = header.file_type_name() or max(counts, key=counts.__getitem__)
    quantized = {t: n for t, n in counts.items() if t not in plain}
    main = max(quantized, key=quantized.__getitem__) if quantized else None
    architecture = header.get("general.architecture")
    build = _build_record(path.parent)
    toolchain = "llama.cpp (GGUF)"
    if build.get("toolchain"):  # scripts/build_gguf.py records the tools' version and the command
        toolchain = f"{build['toolchain']} {build.get('toolchain_version', '')}".strip()
    notes = [f"file {path.name}"]
    if architecture:
        notes.append(f"architecture {architecture}")
    if main is not None and _gguf_bits(main) != _gguf_bits(label):
        # llama-quantize gives a tensor whose rows do not fill its K-quant's 256-weight super-blocks a fallback
        # type, so the file type's name can understate (or overstate) what most tensors hold
        notes.append(f"{quantized[main]} of {sum(quantized.values())} quantized tensors are {main}, not the "
                     f"{label} the file type names (llama-quantize's fallback for rows its blocks do not "
                     "divide)")  # fmt: skip
    if build.get("command"):
        source = build.get("source") or {}
        notes.append(f"built by `{build['command']}` from {source.get('file', '?')} (sha256 "
                     f"{str(source.get('sha256', '?'))[:16]}...)")  # fmt: skip
    return CheckpointScheme(
        format="gguf",
        scheme=label,
        weight_bits=_gguf_bits(main),
        strategy=f"{main} blocks" if main else None,
        storage=", ".join(f"{t} x{n}" for t, n in sorted(counts.items())),
        toolchain=toolchain,
        executed_as="every tensor dequantized to float32 once per file by transformers' GGUF reader (then kept), "
        "computed in the runtime dtype (llama.cpp itself also quantizes activations in its dot products)",
        notes=tuple(notes),
    )


def _gguf_bits(tensor_type: str | None) -> int | None:
    """Nominal bits per weight of a GGUF block or file type (Q4_K -> 4, Q4_K_M -> 4, IQ3_S -> 3, TQ1_0 -> 1),
    None for an unquantized type (F16, BF16, F32)."""
    if tensor_type is None or tensor_type in UNQUANTIZED_GGUF_TYPES:
        return None
    digits = "".join(ch for ch in tensor_type.split("_")[0] if ch.isdigit())
    return int(digits) if digits else None


# --- parent and candidate -----------------------------------------------------------------------------------


def architecture_of(directory: Path, weights_format: str, gguf_file: str | None = None) -> dict[str, Any]:
    """The architecture keys of a checkpoint (config.json, or the config transformers reads from a GGUF)."""
    if weights_format == "gguf":
        from servegate.runtime.model.gguf_kept import gguf_config

        config = gguf_config(gguf_path(directory, gguf_file))
    else:
        config = _read_config(directory)
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    return {key: text.get(key) for key in ARCHITECTURE_KEYS if text.get(key) is not None}


def architecture_problems(parent: dict[str, Any], candidate: dict[str, Any], where: str) -> list[str]:
    """One line per architecture key on which a quantized checkpoint differs from its parent."""
    return [
        f"{where}: {key} is {candidate[key]} but the parent's is {parent[key]}: a quantized build keeps its parent's "
        "architecture; point weights.derived_from (or --baseline) at the model this checkpoint was made from"
        for key in ARCHITECTURE_KEYS
        if key in parent and key in candidate and parent[key] != candidate[key]
    ]
