"""Batching of recorded target responses, with reproducible anchor sampling."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def valid_anchor_positions(loss_mask: Sequence[int] | np.ndarray) -> np.ndarray:
    """Positions `a` where both `a` and `a + 1` are response tokens (SPEC section 2)."""
    mask = np.asarray(loss_mask, dtype=bool)
    return np.flatnonzero(mask[:-1] & mask[1:])


def repeated_positions(input_ids: Sequence[int], n: int) -> np.ndarray:
    """Per position p: the `n` tokens ending at p occurred (ending) earlier in the row, `(T,)` bool. There a suffix
    match of length n already proposes what followed last time: repeated text that decoding drafts by lookup."""
    ids = [int(i) for i in input_ids]
    seen, flags = set(), np.zeros(len(ids), dtype=bool)
    for position in range(n - 1, len(ids)):
        gram = tuple(ids[position - n + 1 : position + 1])
        flags[position] = gram in seen
        seen.add(gram)
    return flags


def sample_anchors(
    input_ids: Sequence[int],
    loss_mask: Sequence[int],
    num_anchors: int,
    seed: int,
    epoch: int = 0,
    skip_repeated: int = 0,
) -> np.ndarray:
    """Up to `num_anchors` sorted anchor positions of one row, drawn without replacement (with `skip_repeated` = n,
    none where `repeated_positions(input_ids, n)`).

    The draw depends only on `(seed, epoch, the row's tokens and loss mask)`, not on batch composition, process rank or
    worker, so a resumed or distributed run sees the same anchors for the same row.
    """
    candidates = valid_anchor_positions(loss_mask)
    if skip_repeated:
        candidates = candidates[~repeated_positions(input_ids, skip_repeated)[candidates]]
    if len(candidates) <= num_anchors:
        return candidates
    ids = np.asarray(input_ids, dtype=np.int64)
    mask = np.asarray(loss_mask, dtype=np.int8)
    row_key = zlib.crc32(mask.tobytes(), zlib.crc32(ids.tobytes()))
    rng = np.random.default_rng([seed, epoch, row_key])
    return np.sort(rng.choice(candidates, size=num_anchors, replace=False))


@dataclass
class CarryoverDataCollator:
    """Right-pads rows of `input_ids` / `loss_mask` and samples anchors per row.

    Returns a batch with `input_ids`, `attention_mask`, `loss_mask` of shape `(batch, T)`, and `anchors` /
    `anchor_mask` of shape `(batch, A)` where `A` is the largest anchor count in the batch (at most `num_anchors`);
    unused anchor slots have `anchor_mask = False`. Rows are never truncated. Rows of a `FeatureStore` also carry
    `target_features` `(T, k*H)` (and top-k log-probabilities), padded to `(batch, T, ...)`.

    Args:
        num_anchors: anchors per sequence (DFlash uses 512; a few dozen suit CPU runs).
        seed: seed of the anchor draw; `epoch` is advanced by the trainer so every epoch sees fresh anchors.
        pad_token_id: id written into padded positions (they are masked out everywhere).
        pad_to_multiple_of: pad `T` up to a multiple of this (helps kernels on GPU).
        skip_repeated: draw no anchor where the last `skip_repeated` tokens occurred earlier in the row (repeated
            text, e.g. a looping answer, which a suffix match drafts at inference); 0: every anchor.
    """

    num_anchors: int = 512
    seed: int = 42
    pad_token_id: int = 0
    pad_to_multiple_of: int | None = None
    epoch: int = 0
    skip_repeated: int = 0

    def __post_init__(self):
        if self.num_anchors < 1:
            raise ValueError(f"num_anchors must be at least 1, got {self.num_anchors}.")
        if self.skip_repeated < 0:
            raise ValueError(f"skip_repeated must be 0 (off) or a token count, got {self.skip_repeated}.")

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        for row in rows:
            if "input_ids" not in row or "loss_mask" not in row:
                raise ValueError(
                    f"Training rows need `input_ids` and `loss_mask` (1 on response tokens); got keys {sorted(row)}."
                )
            if len(row["input_ids"]) != len(row["loss_mask"]):
                raise ValueError(
                    f"A row has {len(row['input_ids'])} input_ids but {len(row['loss_mask'])} loss_mask entries; "
                    "they must align one to one."
                )
        length = max(len(row["input_ids"]) for row in rows)
        if self.pad_to_multiple_of:
            length = -(-length // self.pad_to_multiple_of) * self.pad_to_multiple_of
        anchors = [
            sample_anchors(row["input_ids"], row["loss_mask"], self.num_anchors, self.seed, self.epoch, self.skip_repeated)
            for row in rows
        ]
        num_slots = max(1, max(len(a) for a in anchors))

        batch = {
            "input_ids": torch.full((len(rows), length), self.pad_token_id, dtype=torch.long),
            "attention_mask": torch.zeros((len(rows), length), dtype=torch.long),
            "loss_mask": torch.zeros((len(rows), length), dtype=torch.long),
            "anchors": torch.zeros((len(rows), num_slots), dtype=torch.long),
            "anchor_mask": torch.zeros((len(rows), num_slots), dtype=torch.bool),
        }
        # Offline target features (a `FeatureStore`): padded like the tokens; padded rows are never read.
        for key in _STORED_TARGET_KEYS:
            if key in rows[0]:
                first = torch.as_tensor(rows[0][key])
                batch[key] = torch.zeros((len(rows), length, *first.shape[1:]), dtype=first.dtype)
        for i, (row, row_anchors) in enumerate(zip(rows, anchors)):
            n = len(row["input_ids"])
            batch["input_ids"][i, :n] = torch.as_tensor(row["input_ids"], dtype=torch.long)
            batch["attention_mask"][i, :n] = 1
            batch["loss_mask"][i, :n] = torch.as_tensor(row["loss_mask"], dtype=torch.long)
            batch["anchors"][i, : len(row_anchors)] = torch.as_tensor(row_anchors, dtype=torch.long)
            batch["anchor_mask"][i, : len(row_anchors)] = True
            for key in _STORED_TARGET_KEYS:
                if key in batch:
                    batch[key][i, :n] = torch.as_tensor(row[key])
        return batch


_STORED_TARGET_KEYS = ("target_features", "target_topk_ids", "target_topk_logprobs")


__all__ = ["CarryoverDataCollator", "sample_anchors", "valid_anchor_positions"]
