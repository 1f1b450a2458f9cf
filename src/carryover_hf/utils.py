"""Small helpers shared by generation, the benchmark and training (one place each)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import torch

from .configuration_carryover import PROPOSAL_OPTIONS


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


def without_later_defaults(described: dict, later_defaults: dict) -> dict:
    """`described` without the fields added after fingerprints of it were first recorded, where they hold their
    default: a fingerprint recorded before a field existed then still matches the same thing."""
    return {k: v for k, v in described.items() if not (k in later_defaults and v == later_defaults[k])}


# Config fields added after fingerprints were first recorded (bench journals, feature stores), with their defaults.
LATER_CONFIG_DEFAULTS = {"lookup_backoff": None}


def model_fingerprint(model) -> str:
    """A checksum of a model (a target or a drafter): its config and a strided sample of every weight.

    Cheap (a few thousand values per tensor), and it changes with any retraining, quantisation or dtype change. A
    drafter's per-call proposal defaults (`PROPOSAL_OPTIONS`: threshold, backoffs, lookup) count as unset: a call, and
    every benchmark method, sets them itself, so re-publishing a drafter with other defaults keeps its fingerprint.
    """
    digest = hashlib.sha256()
    config = model.config.to_diff_dict()
    for key in ("_name_or_path", "transformers_version", "_attn_implementation_autoset", "dtype", "torch_dtype"):
        config.pop(key, None)
    config.update({key: None for key in PROPOSAL_OPTIONS if key in config})
    config = without_later_defaults(config, LATER_CONFIG_DEFAULTS)
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step].to(torch.float64).cpu().numpy()
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


__all__ = ["device_synchronizer", "json_fingerprint", "model_fingerprint", "pad_token_id", "without_later_defaults"]
