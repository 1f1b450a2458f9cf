"""Block-sparse attention masks of packed anchors, for the drafter and for the target's parallel verification.

Key/value layout of one sequence:

    [ context rows 0..T-1 ; carry rows (R) ; block rows (A blocks of B) ]

A block row of anchor k sees context rows at positions `< anchors[k]`, the carry rows owned by anchor k, and the rows
of its own block: all of them for the drafter (not causal inside the block), the causal part for the target's verify
pass. Nothing crosses between blocks. Masks are built as dense booleans (True = visible) and then handed to the
attention backend in the form it takes: boolean for sdpa, additive for eager, a `BlockMask` for flex attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBlocks:
    """Where the packed rows of a batch sit.

    anchors (`(b, A)`): anchor positions (block k occupies positions `anchors[k] .. anchors[k] + B - 1`).
    block_size: B.
    context_length: T, the number of context rows (padded sequence length).
    carry_owner (`(b, R)`, optional): the block each carry row belongs to.
    carry_valid (`(b, R)`, optional): whether a carry row exists (rows past the carried segment are padding).
    carry_positions (`(b, R)`, optional): positions of carry rows (used by sliding-window masks).
    """

    anchors: torch.LongTensor
    block_size: int
    context_length: int
    carry_owner: torch.LongTensor | None = None
    carry_valid: torch.BoolTensor | None = None
    carry_positions: torch.LongTensor | None = None

    @property
    def num_blocks(self) -> int:
        return self.anchors.shape[1]

    @property
    def num_carry(self) -> int:
        return 0 if self.carry_owner is None else self.carry_owner.shape[1]

    @property
    def num_block_rows(self) -> int:
        return self.num_blocks * self.block_size

    def block_position_ids(self) -> torch.LongTensor:
        """`(b, A * B)`: row j of block k sits at `anchors[k] + j`."""
        offsets = torch.arange(self.block_size, device=self.anchors.device)
        return (self.anchors[:, :, None] + offsets).flatten(1)


def block_sparse_mask(
    packed: PackedBlocks, causal: bool = False, sliding_window: int | None = None
) -> torch.BoolTensor:
    """Dense boolean mask `(b, 1, A*B, T + R + A*B)` over `[context ; carry ; block]` keys, True = visible.

    `causal=True` gives the target's verify mask (a row sees the rows of its block up to itself); `sliding_window`
    additionally limits keys to positions `> query_position - sliding_window`, as Transformers' sliding layers do.
    """
    device = packed.anchors.device
    batch = packed.anchors.shape[0]
    num_q, size = packed.num_block_rows, packed.block_size
    q_block = torch.arange(num_q, device=device) // size  # (Q,)
    q_anchor = packed.anchors[:, q_block]  # (b, Q)

    context = torch.arange(packed.context_length, device=device)[None, None, :] < q_anchor[:, :, None]  # (b, Q, T)
    parts = [context]
    if packed.num_carry:
        carry = (packed.carry_owner[:, None, :] == q_block[None, :, None]) & packed.carry_valid[:, None, :]
        parts.append(carry)
    same_block = q_block[:, None] == q_block[None, :]
    if causal:
        same_block = same_block & (
            torch.arange(num_q, device=device)[None, :] <= torch.arange(num_q, device=device)[:, None]
        )
    parts.append(same_block.expand(batch, num_q, num_q))
    mask = torch.cat(parts, dim=-1)

    if sliding_window is not None:
        q_pos = packed.block_position_ids()  # (b, Q)
        k_pos = [torch.arange(packed.context_length, device=device).expand(batch, -1)]
        if packed.num_carry:
            k_pos.append(packed.carry_positions)
        k_pos.append(q_pos)
        k_pos = torch.cat(k_pos, dim=-1)  # (b, K)
        mask = mask & (k_pos[:, None, :] > q_pos[:, :, None] - sliding_window)
    return mask[:, None]


def to_backend_mask(mask: torch.BoolTensor, attn_implementation: str | None, dtype: torch.dtype):
    """The boolean mask in the form `attn_implementation` expects.

    sdpa takes booleans; eager adds the mask to the scores, so it gets 0 / dtype-min; flex attention gets a sparse
    `BlockMask` so that the skipped tiles cost nothing.
    """
    if attn_implementation == "eager" or attn_implementation is None:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    if attn_implementation == "flex_attention":
        from torch.nn.attention.flex_attention import create_block_mask

        dense = mask[:, 0]

        def mask_mod(b, h, q_idx, kv_idx):
            return dense[b, q_idx, kv_idx]

        return create_block_mask(
            mask_mod, B=mask.shape[0], H=None, Q_LEN=mask.shape[-2], KV_LEN=mask.shape[-1], device=mask.device
        )
    return mask


__all__ = ["PackedBlocks", "block_sparse_mask", "to_backend_mask"]
