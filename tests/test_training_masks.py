"""Block-sparse masks, labels and anchor sampling of the training batches."""

import datasets
import numpy as np
import pytest
import torch

from carryover_hf.training.collator import CarryoverDataCollator, sample_anchors, valid_anchor_positions
from carryover_hf.training.data import check_training_dataset
from carryover_hf.training.losses import block_labels, default_gamma, draft_losses, position_weights
from carryover_hf.training.masks import PackedBlocks, block_sparse_mask, to_backend_mask


def _packed_with_carry():
    anchors = torch.tensor([[2, 7, 4], [0, 5, 9]])
    size, length = 4, 12
    owner = torch.arange(3).repeat_interleave(size - 1).expand(2, -1)
    valid = torch.rand(2, 9, generator=torch.Generator().manual_seed(0)) > 0.4
    positions = (anchors[:, :, None] + torch.arange(1, size)).flatten(1)
    return PackedBlocks(anchors, size, length, owner, valid, positions)


def test_drafter_mask_is_block_sparse():
    packed = _packed_with_carry()
    mask = block_sparse_mask(packed)[:, 0]  # (b, Q, T + R + Q)
    T, R, B = packed.context_length, packed.num_carry, packed.block_size
    for b in range(2):
        for q in range(packed.num_block_rows):
            block, anchor = q // B, int(packed.anchors[b, q // B])
            context, carry, rows = mask[b, q, :T], mask[b, q, T : T + R], mask[b, q, T + R :]
            # Context strictly before the anchor, nothing at or after it.
            assert context[:anchor].all() and not context[anchor:].any()
            # Only this block's existing carry rows.
            expected_carry = (packed.carry_owner[b] == block) & packed.carry_valid[b]
            assert torch.equal(carry, expected_carry)
            # Its own block, bidirectionally, and no other block.
            own = torch.zeros(packed.num_block_rows, dtype=torch.bool)
            own[block * B : (block + 1) * B] = True
            assert torch.equal(rows, own)


def test_verify_mask_is_causal_inside_blocks_and_sliding_window():
    anchors = torch.tensor([[3, 8]])
    packed = PackedBlocks(anchors, 4, 10)
    mask = block_sparse_mask(packed, causal=True)[0, 0]
    rows = mask[:, 10:]
    for q in range(8):
        block, j = divmod(q, 4)
        expected = torch.zeros(8, dtype=torch.bool)
        expected[block * 4 : block * 4 + j + 1] = True
        assert torch.equal(rows[q], expected)
    windowed = block_sparse_mask(packed, causal=True, sliding_window=3)[0, 0]
    positions = torch.cat([torch.arange(10), packed.block_position_ids()[0]])
    q_positions = packed.block_position_ids()[0]
    assert torch.equal(windowed, mask & (positions[None, :] > q_positions[:, None] - 3))


def test_backend_masks():
    mask = block_sparse_mask(PackedBlocks(torch.tensor([[1, 3]]), 2, 5))
    assert to_backend_mask(mask, "sdpa", torch.float32).dtype == torch.bool
    additive = to_backend_mask(mask, "eager", torch.float32)
    assert torch.equal(additive == 0, mask)
    assert (additive[~mask] == torch.finfo(torch.float32).min).all()


def test_labels_end_with_the_response():
    # prompt (0), response (1) of 5 tokens, a user turn (0), a second response (1), then padding.
    loss_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1]])
    input_ids = torch.arange(12)[None] + 10
    anchors = torch.tensor([[2, 5, 9, 10, 0]])
    anchor_valid = torch.tensor([[True, True, True, True, False]])
    labels, valid = block_labels(input_ids, loss_mask, anchors, anchor_valid, block_size=4)
    assert labels[0, 0].tolist() == [13, 14, 15]
    assert valid[0].tolist() == [
        [True, True, True],  # x3..x5 are response tokens
        [True, False, False],  # x6 is the last response token; x7 belongs to the user turn
        [True, True, False],  # x10, x11, then past the end of the sequence
        [True, False, False],
        [False, False, False],  # unused anchor slot
    ]


def test_anchor_positions_need_two_response_tokens():
    assert valid_anchor_positions([0, 1, 1, 0, 1, 1, 1, 0, 1]).tolist() == [1, 4, 5]


def test_anchor_sampling_is_reproducible():
    ids, mask = list(range(100)), [0] * 10 + [1] * 90
    first = sample_anchors(ids, mask, 16, seed=3)
    assert np.array_equal(first, sample_anchors(ids, mask, 16, seed=3))
    assert len(first) == 16 and np.all(np.diff(first) > 0) and first.min() >= 10 and first.max() <= 98
    assert not np.array_equal(first, sample_anchors(ids, mask, 16, seed=4))
    assert not np.array_equal(first, sample_anchors(ids, mask, 16, seed=3, epoch=1))
    # Fewer candidates than requested: all of them.
    assert sample_anchors([1, 2, 3, 4], [0, 1, 1, 1], 16, seed=0).tolist() == [1, 2]


def test_collator_pads_without_truncating_and_is_order_independent():
    rows = [
        {"input_ids": list(range(1, 21)), "loss_mask": [0] * 5 + [1] * 15},
        {"input_ids": list(range(30, 37)), "loss_mask": [0, 0, 0, 1, 1, 1, 1]},
    ]
    collator = CarryoverDataCollator(num_anchors=4, seed=0, pad_token_id=0)
    batch = collator(rows)
    assert batch["input_ids"].shape == (2, 20)
    assert batch["attention_mask"][1].tolist() == [1] * 7 + [0] * 13
    assert batch["anchor_mask"].tolist() == [[True] * 4, [True, True, True, False]]
    assert batch["anchors"][1, :3].tolist() == [3, 4, 5]
    swapped = collator(rows[::-1])
    assert torch.equal(swapped["anchors"][1], batch["anchors"][0])
    with pytest.raises(ValueError, match="loss_mask"):
        collator([{"input_ids": [1, 2, 3]}])
    with pytest.raises(ValueError, match="align"):
        collator([{"input_ids": [1, 2, 3], "loss_mask": [1, 1]}])


def test_dataset_checks():
    good = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4]], "loss_mask": [[0, 1, 1, 1]]})
    check_training_dataset(good, vocab_size=64, max_length=16)
    with pytest.raises(ValueError, match="lacks the column"):
        check_training_dataset(good.remove_columns("loss_mask"), 64)
    with pytest.raises(ValueError, match="vocabulary"):
        check_training_dataset(good, vocab_size=4)
    with pytest.raises(ValueError, match="never truncated"):
        check_training_dataset(good, vocab_size=64, max_length=3)
    with pytest.raises(ValueError, match="align"):
        check_training_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2]], "loss_mask": [[1]]}), 64)
    with pytest.raises(ValueError, match="nothing to train"):
        check_training_dataset(datasets.Dataset.from_dict({"input_ids": [[1, 2, 3]], "loss_mask": [[1, 0, 1]]}), 64)


def test_losses_and_weights():
    assert torch.allclose(position_weights(16, 7.0)[:3], torch.exp(-torch.tensor([0.0, 1.0, 2.0]) / 7))
    assert default_gamma(16) == 7.0
    logits = torch.randn(2, 3, 5, 11)
    labels = torch.randint(0, 11, (2, 3, 5))
    ce = draft_losses(logits, labels)
    assert torch.allclose(
        ce, torch.nn.functional.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none").view(2, 3, 5)
    )
    # Distilling towards itself: the divergence vanishes and only (1 - w) CE is left.
    for kind in ("kl", "tv"):
        mixed = draft_losses(logits, labels, logits, kind, 0.9)
        assert torch.allclose(mixed, 0.1 * ce, atol=1e-5)
    tv = draft_losses(logits, labels, torch.randn_like(logits), "tv", 1.0)
    assert (tv >= 0).all() and (tv <= 1).all()


def test_flex_block_mask_matches_the_dense_mask():
    """The `BlockMask` handed to flex attention on GPU encodes the same visibility as the dense boolean mask.

    Checked with PyTorch's uncompiled flex attention against sdpa (Transformers compiles flex attention, which needs
    a GPU or a working inductor C++ toolchain).
    """
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    packed = _packed_with_carry()
    mask = block_sparse_mask(packed)
    block_mask = to_backend_mask(mask, "flex_attention", torch.float32)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 2, mask.shape[-2], 8, generator=generator)
    key, value = (torch.randn(2, 2, mask.shape[-1], 8, generator=generator) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = flex_attention(query, key, value, block_mask=block_mask)
    sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)
