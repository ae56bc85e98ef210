"""Weight loading: resolve the manifest's source, verify checksums, refuse pickle unless opted in, load.

    zoo:NAME            a model shipped with servegate (servegate.zoo)
    ./path/to/dir       a local directory, relative to the manifest
    hf:ORG/NAME@REV     the Hugging Face hub (offline: fails at once and says what to do instead)

Nothing is loaded before every file named in `weights.sha256` matches.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from servegate.contracts.errors import ServegateError
from servegate.contracts.manifest import ServedModel
from servegate.runtime.model.checkpoint_scheme import CheckpointScheme, gguf_path, read_scheme
from servegate.runtime.model.cpu_linear import use_torch_threads
from servegate.runtime.model.gguf_kept import gguf_checkpoint_dir, gguf_tokenizer_dir

SAFETENSORS_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
"""Weight files that are loaded by unpickling (can run arbitrary code when loaded)."""


@dataclass
class LoadedModel:
    """A causal LM ready to run: the model in eval mode, its tokenizer, and where and how it runs."""

    model: Any
    tokenizer: Any
    device: torch.device
    dtype: torch.dtype
    """Compute dtype of the model's floating weights."""
    weights_dir: Path


def resolve_weights_dir(served: ServedModel) -> Path:
    """The local directory holding the manifest's weights (downloaded first for an `hf:` source)."""
    source = served.weights.source
    if source.startswith("zoo:"):
        from servegate.zoo import ZooError, zoo_model_path

        try:
            return Path(zoo_model_path(source.removeprefix("zoo:")))
        except ZooError as exc:
            raise ServegateError(f"weights.source {source}: {exc}") from None
    if source.startswith("hf:"):
        return _download(source)
    path = served.resolve_path(source)
    if not path.is_dir():
        raise ServegateError(f"weights.source {source!r}: {path} is not a directory holding model files")
    return path


def _download(source: str) -> Path:
    """snapshot_download of `hf:ORG/NAME@REV`, turning every failure into one actionable line."""
    repo, _, revision = source.removeprefix("hf:").partition("@")
    hint = (
        f"download it where the hub is reachable (e.g. `hf download {repo}"
        f"{' --revision ' + revision if revision else ''} --local-dir DIR`) and set weights.source to that folder"
    )
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(repo_id=repo, revision=revision or None, local_files_only=offline, etag_timeout=10)
    except Exception as exc:  # offline mode, no network, unknown repo or revision: all end the same way
        reason = "the hub is offline (HF_HUB_OFFLINE is set)" if offline else f"{type(exc).__name__}: {exc}"
        raise ServegateError(f"cannot fetch {source}: {reason.splitlines()[0]}; {hint}") from None
    return Path(path)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB pieces."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for piece in iter(lambda: handle.read(1 << 20), b""):
            digest.update(piece)
    return digest.hexdigest()


def verify_checksums(directory: Path, expected: dict[str, str]) -> None:
    """Refuse (ServegateError) unless every listed file exists under `directory` with the listed sha256."""
    for name, digest in sorted(expected.items()):
        path = directory / name
        if not path.is_file():
            raise ServegateError(f"weights.sha256 lists {name} but {directory} has no such file: refusing to load")
        actual = sha256_of(path)
        if actual != digest.lower():
            raise ServegateError(
                f"checksum mismatch for {name} in {directory}: expected {digest}, got {actual}: refusing to load"
            )


def check_weight_format(directory: Path, allow_pickle: bool) -> bool:
    """Whether to load safetensors (True) or pickle files (False); refuse pickle-only weights without opt-in."""
    files = [p for p in directory.rglob("*") if p.is_file()]
    if any(p.name.endswith(SAFETENSORS_SUFFIXES) for p in files):
        return True
    pickles = sorted(p.name for p in files if p.name.endswith(PICKLE_SUFFIXES))
    if not pickles:
        raise ServegateError(f"{directory} holds no weight files (*.safetensors)")
    if not allow_pickle:
        raise ServegateError(
            f"{directory} holds only pickle weights ({', '.join(pickles[:3])}), which can run arbitrary code when "
            "loaded: convert them to safetensors, or set weights.format: pickle and weights.allow_pickle: true"
        )
    return False


def resolve_device(name: str) -> torch.device:
    """`auto` -> CUDA when present, else CPU; `cuda` without a GPU is refused."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ServegateError("runtime.device is cuda but no CUDA device is available: use device: auto or cpu")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """Compute dtype: `auto` is float32 on CPU and bfloat16 on CUDA."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def served_scheme(served: ServedModel) -> CheckpointScheme | None:
    """A manifest's toolchain checkpoint scheme as its files record it (None for plain weights, or for a hub
    source, which would have to be downloaded first); a ServegateError when the runtime cannot run it."""
    weights = served.weights
    if not weights.quantized_checkpoint or weights.source.startswith("hf:"):
        return None
    return read_scheme(resolve_weights_dir(served), weights.format, weights.gguf_file)


def _format_kwargs(served: ServedModel, directory: Path) -> tuple[dict[str, Any], CheckpointScheme]:
    """from_pretrained's arguments for the manifest's weights format, and the checkpoint's scheme (read first, so
    a scheme the runtime cannot run, or a GPTQ/AWQ/bitsandbytes folder, is refused by name before loading)."""
    weights = served.weights
    scheme = read_scheme(directory, weights.format, weights.gguf_file)
    if weights.format == "gguf":  # the file's float32 conversion, made once and kept (gguf_kept.py)
        return {"use_safetensors": True}, scheme
    if weights.format == "compressed-tensors":
        if _absent("compressed_tensors"):
            raise ServegateError(
                f"weights.format compressed-tensors ({directory}) needs the compressed-tensors package: "
                "pip install 'servegate[real]'"
            )
        from transformers import CompressedTensorsConfig

        # dense weights once at load: the runtime's own kernels (and the paged attention) then run them
        return {"quantization_config": CompressedTensorsConfig(dequantize=True), "use_safetensors": True}, scheme
    return {"use_safetensors": check_weight_format(directory, weights.allow_pickle)}, scheme


def _absent(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None


def load_causal_lm(served: ServedModel) -> LoadedModel:
    """Resolve, verify and load the manifest's causal LM and tokenizer (not quantized: see quantization.py;
    a quantized checkpoint is dequantized at load, see checkpoint_scheme.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from servegate.runtime.model.paged_attention import register_paged_attention

    weights, runtime = served.weights, served.runtime
    directory = resolve_weights_dir(served)
    verify_checksums(directory, weights.sha256)
    kwargs, scheme = _format_kwargs(served, directory)
    if weights.format == "gguf":
        directory = gguf_checkpoint_dir(gguf_path(directory, weights.gguf_file))
    use_torch_threads(runtime.threads)
    device = resolve_device(runtime.device)
    dtype = resolve_dtype(runtime.dtype, device)
    load_dtype = "auto" if weights.dtype == "auto" else getattr(torch, weights.dtype)
    if weights.format == "gguf" and load_dtype == "auto":
        load_dtype = torch.float32  # the GGUF reader dequantizes to float32; "auto" would keep its f16 tensors
    try:
        with warnings.catch_warnings():
            # transformers warns that the checkpoint's quantization_config wins: it does; only `dequantize` is ours
            warnings.filterwarnings("ignore", message="You passed `quantization_config`")
            model = AutoModelForCausalLM.from_pretrained(
                directory,
                dtype=load_dtype,
                attn_implementation=register_paged_attention(),
                local_files_only=True,
                **kwargs,
            )
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError, pickle.UnpicklingError) as exc:  # unpickling: torch's weights_only refusal
        raise ServegateError(f"cannot load a causal LM from {directory}: {str(exc).splitlines()[0]}") from None
    if scheme.activations is not None:
        from servegate.runtime.model.quantization import simulate_activations

        simulate_activations(model, scheme)
    # weights.dtype rounds the stored weights; runtime.dtype is what they compute in (transformers wraps
    # PreTrainedModel.to in a decorator whose stub loses `self`)
    model = model.to(device=device, dtype=dtype).eval()  # type: ignore[call-arg]
    return LoadedModel(model=model, tokenizer=tokenizer, device=device, dtype=dtype, weights_dir=directory)


def load_tokenizer(served: ServedModel) -> Any:
    """The manifest's tokenizer alone (an endpoint backend preprocesses here and runs the model remotely)."""
    from transformers import AutoTokenizer

    directory = resolve_weights_dir(served)
    if served.weights.format == "gguf":  # the tokenizer the file carries, read once and kept
        directory = gguf_tokenizer_dir(gguf_path(directory, served.weights.gguf_file))
    try:
        return AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise ServegateError(f"cannot load the tokenizer from {directory}: {str(exc).splitlines()[0]}") from None
