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


def cpu_computes_bfloat16() -> bool:
    """Whether this CPU has bfloat16 arithmetic of its own (AVX-512 BF16 or AMX), where oneDNN runs a bfloat16 matmul
    faster than a float32 one (2.6x for SmolLM2-135M's forward on an AMD EPYC with AVX-512 BF16). Elsewhere bfloat16 is
    emulated and slower."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def resolve_auto_bfloat16(choice: str | None) -> str | None:
    """A dtype setting that may be "auto" (bfloat16 where `cpu_computes_bfloat16`, else None: the default dtype)."""
    if choice == "auto":
        return "bfloat16" if cpu_computes_bfloat16() else None
    return choice


def model_fingerprint(model) -> str:
    """A checksum of a model (a target or a drafter): its config and a strided sample of every weight.

    Cheap (a few thousand values per tensor), and it changes with any retraining, quantisation or dtype change. A
    drafter's proposal defaults are not part of it (they are its `generation_config`, not its config).
    """
    return _fingerprint(model, as_bfloat16=False)


def weights_fingerprint(model) -> str:
    """`model_fingerprint` of the weights' values rounded to bfloat16, whatever dtype they are held in: the same for a
    float32 model and its bfloat16 copy (rounding to bfloat16 is exact to repeat), different for other weights. A
    feature store built by a target run in bfloat16 records it, so that it trains drafters for the float32 target."""
    return _fingerprint(model, as_bfloat16=True)


def _fingerprint(model, as_bfloat16: bool) -> str:
    digest = hashlib.sha256()
    config = model.config.to_diff_dict()
    for key in ("_name_or_path", "transformers_version", "_attn_implementation_autoset", "dtype", "torch_dtype"):
        config.pop(key, None)
    digest.update(json.dumps(config, sort_keys=True, default=str).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().reshape(-1)
        step = max(1, flat.numel() // 4096)
        sample = flat[::step]
        if as_bfloat16 and sample.is_floating_point():
            sample = sample.to(torch.bfloat16)
        sample = sample.to(torch.float64).cpu().numpy()
        kind = "floating" if as_bfloat16 and tensor.is_floating_point() else tensor.dtype
        digest.update(f"{name}:{tuple(tensor.shape)}:{kind}:".encode())
        digest.update(sample.tobytes())
    return digest.hexdigest()[:16]


__all__ = ["cpu_computes_bfloat16", "device_synchronizer", "file_sha256", "json_fingerprint", "model_fingerprint", "pad_token_id", "resolve_auto_bfloat16", "weights_fingerprint"]
