"""Reading checkpoints: resolve a folder or Hub repo, read `config.json`, read safetensors weights (nothing else)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from huggingface_hub import snapshot_download
from safetensors.torch import load_file


ALLOWED_PATTERNS = ["config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json", "README.md"]


class CheckpointError(ValueError):
    """A checkpoint cannot be read or converted; the message names what to fix."""


def resolve_checkpoint(name_or_path: str | Path, revision: str | None = None, token: str | bool | None = None) -> Path:
    """A local folder as is; otherwise a Hub repo id, fetched (config and safetensors only) or read from the cache."""
    path = Path(name_or_path)
    if path.is_dir():
        return path
    if path.exists():
        raise CheckpointError(f"{path} is a file; pass the checkpoint folder (with config.json and *.safetensors).")
    try:
        return Path(
            snapshot_download(str(name_or_path), revision=revision, token=token, allow_patterns=ALLOWED_PATTERNS)
        )
    except Exception as error:  # offline, unknown repo, no access: all end the same way for the user
        raise CheckpointError(
            f"{name_or_path!r} is neither a local folder nor a Hub repository that can be fetched ({error}). "
            "Pass a folder with config.json and *.safetensors, or a repo id reachable from here or in the Hub cache."
        ) from error


def read_config(folder: Path) -> dict:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"{folder} has no config.json; a checkpoint folder needs its config and safetensors.")
    return json.loads(config_file.read_text())


def safetensors_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint (an index's shards, or every *.safetensors); refuses pickle formats."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [name for name in shards if not (folder / name).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are not in {folder}: {missing}")
        return [folder / name for name in shards]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
    hint = (
        f" It holds {pickles}: weights are only read from safetensors (pickle files can run code); convert them with "
        "safetensors' own tools in an environment you trust."
        if pickles
        else ""
    )
    raise CheckpointError(f"No *.safetensors weights in {folder}.{hint}")


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    weights: dict[str, torch.Tensor] = {}
    for file in safetensors_files(folder):
        for name, tensor in load_file(str(file)).items():
            if name in weights:
                raise CheckpointError(f"Tensor {name!r} appears in more than one shard of {folder}.")
            weights[name] = tensor
    return weights


__all__ = ["CheckpointError", "read_config", "read_weights", "resolve_checkpoint", "safetensors_files"]
