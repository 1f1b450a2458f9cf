"""Block-sparse attention masks of packed anchors, for the drafter and for the target's parallel verification.

Key/value layout of one sequence:

    [ context rows 0..T-1 ; carry rows (R) ; block rows (A blocks of B) ]

A block row of anchor k sees context rows at positions `< anchors[k]`, the existing carry rows owned by anchor k, and
the rows of its own block: all of them for the drafter (not causal inside the block), the causal part for the target's
verify pass; a sliding window further keeps only keys at positions `> query_position - window`. Nothing crosses
between blocks.

The mask is described once, as a predicate over one query and one key in the style of flex attention's
`mask_mod(b, h, q_idx, kv_idx)` (`BlockSparseMask.mask_mod`). Every form an attention backend takes is derived from
it: the dense boolean mask (sdpa) evaluates the predicate on broadcast index tensors, the additive mask (eager) is
that boolean mask as 0 / dtype-min, and flex attention's `BlockMask` is built from the predicate itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Owner of context rows: they belong to no block, and each block sees the part before its anchor.
CONTEXT_OWNER = -1


@dataclass
class PackedBlocks:
    """Where the packed rows of a batch sit.

    anchors (`(b, A)`): anchor positions (block k occupies positions `anchors[k] .. anchors[k] + B - 1`).
    block_size: B.
    context_length: T, the number of context rows (padded sequence length).
    carry_owner (`(b, R)`, optional): the block each carry row belongs to.
    carry_valid (`(b, R)`, optional): whether a carry row exists (rows past the carried segment are padding); all
        rows exist when omitted.
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

    @property
    def num_keys(self) -> int:
        return self.context_length + self.num_carry + self.num_block_rows

    def block_position_ids(self) -> torch.LongTensor:
        """`(b, A * B)`: row j of block k sits at `anchors[k] + j`."""
        offsets = torch.arange(self.block_size, device=self.anchors.device)
        return (self.anchors[:, :, None] + offsets).flatten(1)

    def key_rows(self) -> tuple[torch.LongTensor, torch.LongTensor, torch.BoolTensor, torch.BoolTensor]:
        """Per key row `(b, T + R + A*B)`: owner block (`CONTEXT_OWNER` for context rows), position, whether the
        row exists, and whether it is a block row (the rows a causal mask orders)."""
        batch, device = self.anchors.shape[0], self.anchors.device
        length, rows = self.context_length, self.num_block_rows

        def constant(n, value, dtype=torch.bool):
            return torch.full((batch, n), value, dtype=dtype, device=device)

        owner = [constant(length, CONTEXT_OWNER, torch.long)]
        position = [torch.arange(length, device=device).expand(batch, -1)]
        valid, in_block = [constant(length, True)], [constant(length, False)]
        if self.num_carry:
            owner.append(self.carry_owner)
            # Only sliding windows read carry positions, and `BlockSparseMask` refuses one without them.
            carry_positions = self.carry_positions
            position.append(constant(self.num_carry, -1, torch.long) if carry_positions is None else carry_positions)
            valid.append(constant(self.num_carry, True) if self.carry_valid is None else self.carry_valid.bool())
            in_block.append(constant(self.num_carry, False))
        owner.append((torch.arange(rows, device=device) // self.block_size).expand(batch, -1))
        position.append(self.block_position_ids())
        valid.append(constant(rows, True))
        in_block.append(constant(rows, True))
        return torch.cat(owner, 1), torch.cat(position, 1), torch.cat(valid, 1), torch.cat(in_block, 1)


def visible(
    query_anchor: torch.Tensor,
    query_owner: torch.Tensor,
    query_position: torch.Tensor,
    key_owner: torch.Tensor,
    key_position: torch.Tensor,
    key_valid: torch.Tensor,
    key_in_block: torch.Tensor,
    causal: bool = False,
    sliding_window: int | None = None,
) -> torch.BoolTensor:
    """The mask function: whether a query row (of block `query_owner`, at `query_position`, anchored at
    `query_anchor`) sees a key row. Elementwise over broadcastable tensors.

    Context keys (owner `CONTEXT_OWNER`) are seen before the anchor; carry and block keys only by their own block,
    block keys up to the query's position when `causal`; invalid keys never; with `sliding_window`, only keys at
    positions `> query_position - sliding_window`.
    """
    # Terms over keys alone come first: on broadcast index grids they cost a row of keys, not a query x key grid.
    bounds = torch.iinfo(key_position.dtype)
    block_owner = torch.where(key_valid, key_owner, CONTEXT_OWNER)  # invalid rows belong to no block
    prefix_position = torch.where(key_valid & (key_owner == CONTEXT_OWNER), key_position, bounds.max)
    seen = block_owner == query_owner
    if causal:  # only block rows are ordered; carry rows stay visible to their block
        seen = seen & (torch.where(key_in_block, key_position, bounds.min) <= query_position)
    seen = seen | (prefix_position < query_anchor)
    if sliding_window is not None:
        seen = seen & (key_position > query_position - sliding_window)
    return seen


@dataclass(frozen=True)
class BlockSparseMask:
    """One description of the mask of packed blocks, and every form derived from it.

    `mask_mod` is the predicate over `(b, h, q_idx, kv_idx)`; `dense()` is the boolean mask (sdpa),
    `additive(dtype)` the 0 / dtype-min mask (eager), `block_mask()` flex attention's `BlockMask`, and
    `for_backend(attn_implementation, dtype)` picks the one an attention backend takes.
    """

    packed: PackedBlocks
    causal: bool = False
    sliding_window: int | None = None

    def __post_init__(self):
        packed = self.packed
        if self.sliding_window is not None and packed.num_carry and packed.carry_positions is None:
            raise ValueError("A sliding-window mask over carry rows needs their positions (`carry_positions`).")

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.packed.anchors.shape[0], 1, self.packed.num_block_rows, self.packed.num_keys)

    @property
    def mask_mod(self) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.BoolTensor]:
        """The predicate `mask_mod(b, h, q_idx, kv_idx)`: whether query row `q_idx` of sequence `b` sees key row
        `kv_idx` (every head `h` alike).

        Indices are integer tensors: scalars under flex attention's vmap, or broadcastable index grids. (A closure
        rather than a method, since flex attention tells a mask_mod by its four positional arguments.)
        """
        packed, causal, window = self.packed, self.causal, self.sliding_window
        size = packed.block_size
        # Per query row (b, Q): its block's anchor and its position; per key row (b, K): `PackedBlocks.key_rows`.
        query_anchor, query_position = packed.anchors.repeat_interleave(size, dim=1), packed.block_position_ids()
        key_rows = packed.key_rows()

        def mask_mod(b, h, q_idx, kv_idx):
            key_owner, key_position, key_valid, key_in_block = (rows[b, kv_idx] for rows in key_rows)
            query = query_anchor[b, q_idx], q_idx // size, query_position[b, q_idx]
            return visible(*query, key_owner, key_position, key_valid, key_in_block, causal, window)

        return mask_mod

    def dense(self) -> torch.BoolTensor:
        """Boolean mask `(b, 1, Q, K)`, True = visible: the predicate on broadcast index tensors."""
        batch, _, num_q, num_k = self.shape
        device = self.packed.anchors.device
        b = torch.arange(batch, device=device)[:, None, None]
        q_idx = torch.arange(num_q, device=device)[None, :, None]
        kv_idx = torch.arange(num_k, device=device)[None, None, :]
        head = torch.zeros((), dtype=torch.long, device=device)
        return self.mask_mod(b, head, q_idx, kv_idx)[:, None]

    def additive(self, dtype: torch.dtype) -> torch.Tensor:
        """Mask `(b, 1, Q, K)` added to attention scores: 0 where visible, the dtype's minimum elsewhere."""
        return additive_mask(self.dense(), dtype)

    def block_mask(self):
        """Flex attention's `BlockMask`, built from the predicate (tiles where nothing is visible are skipped)."""
        from torch.nn.attention.flex_attention import create_block_mask

        batch, _, num_q, num_k = self.shape
        return create_block_mask(
            self.mask_mod, B=batch, H=None, Q_LEN=num_q, KV_LEN=num_k, device=self.packed.anchors.device
        )

    def for_backend(self, attn_implementation: str | None, dtype: torch.dtype):
        """The form `attn_implementation` takes: additive for eager (and None), a `BlockMask` for flex attention,
        booleans otherwise (sdpa)."""
        if attn_implementation == "eager" or attn_implementation is None:
            return self.additive(dtype)
        if attn_implementation == "flex_attention":
            return self.block_mask()
        return self.dense()


def additive_mask(mask: torch.BoolTensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = visible) as the additive mask eager attention takes: 0 / dtype-min."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def block_sparse_mask(
    packed: PackedBlocks, causal: bool = False, sliding_window: int | None = None
) -> torch.BoolTensor:
    """Dense boolean mask `(b, 1, A*B, T + R + A*B)` over `[context ; carry ; block]` keys, True = visible.

    `causal=True` gives the target's verify mask (a row sees the rows of its block up to itself); `sliding_window`
    additionally limits keys to positions `> query_position - sliding_window`, as Transformers' sliding layers do.
    """
    return BlockSparseMask(packed, causal, sliding_window).dense()


def backend_mask(
    packed: PackedBlocks,
    attn_implementation: str | None,
    dtype: torch.dtype,
    causal: bool = False,
    sliding_window: int | None = None,
):
    """The mask of `packed` in the form `attn_implementation` takes (see `BlockSparseMask.for_backend`)."""
    return BlockSparseMask(packed, causal, sliding_window).for_backend(attn_implementation, dtype)


__all__ = [
    "CONTEXT_OWNER",
    "BlockSparseMask",
    "PackedBlocks",
    "additive_mask",
    "backend_mask",
    "block_sparse_mask",
    "visible",
]
