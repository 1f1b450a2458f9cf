"""Small helpers shared by generation, the benchmark and training (one place each)."""

from __future__ import annotations

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


__all__ = ["device_synchronizer", "pad_token_id"]
