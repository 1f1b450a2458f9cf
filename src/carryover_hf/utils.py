"""Small helpers shared by generation, the benchmark and training (one place each)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import torch


def device_synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for queued work on `device` (CUDA); a no-op elsewhere. Call it only around timings."""
    device = torch.device(device)
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def pad_token_id(config, fallback: int | None = 0) -> int | None:
    """`config.pad_token_id` (a model or generation config), else its first end-of-sequence id, else `fallback`."""
    pad = getattr(config, "pad_token_id", None)
    if isinstance(pad, int):
        return pad
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return eos if isinstance(eos, int) else fallback


def json_fingerprint(value) -> str:
    """A short checksum of a JSON-able value (dicts in key order; other objects by their `str`)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def file_sha256(path, chunk: int = 1 << 22) -> str:
    """Hex SHA-256 of a file, read in `chunk`-byte blocks (memory stays flat for multi-GB files): the one file checksum
    of the project (the converted target's record; `gpu_job/travel.py` loads this module by its path)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def model_fingerprint(model) -> str:
    """A checksum of a model (a target or a drafter): its config and a strided sample of every weight.

    Cheap (a few thousand values per tensor), and it changes with any retraining, quantisation or dtype change. A
    drafter's proposal defaults are not part of it (they are its `generation_config`, not its config).
    """
    digest = hashlib.sha256()
    config = model.config.to_diff_dict()
    for key in ("_name_or_path", "transformers_version", "_attn_implementation_autoset", "dtype", "torch_dtype"):
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step].to(torch.float64).cpu().numpy()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


__all__ = ["device_synchronizer", "file_sha256", "json_fingerprint", "model_fingerprint", "pad_token_id"]
