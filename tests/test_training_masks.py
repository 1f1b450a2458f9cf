"""Block-sparse masks, labels and anchor sampling of the training batches."""

import datasets
import numpy as np
import pytest
import torch

from carryover_hf.training.collator import (
    CarryoverDataCollator,
    repeated_positions,
    sample_anchors,
    valid_anchor_positions,
)
from carryover_hf.training.data import check_training_dataset
from carryover_hf.training.losses import block_labels, default_gamma, draft_losses, position_weights
from carryover_hf.masks import (
    BlockSparseMask,
    PackedBlocks,
    additive_mask,
    backend_mask,
    block_sparse_mask,
)


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
    packed = PackedBlocks(torch.tensor([[1, 3]]), 2, 5)
    mask = block_sparse_mask(packed)
    sdpa = backend_mask(packed, "sdpa", torch.float32)
    assert sdpa.dtype == torch.bool and torch.equal(sdpa, mask)
    additive = backend_mask(packed, "eager", torch.float32)
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


def test_anchors_can_skip_repeated_text():
    # A prompt, then an answer that loops: 5 6 7 8 9 5 6 7 8 9 5 6 ...
    ids = [1, 2, 3] + [5, 6, 7, 8, 9] * 4
    mask = [0, 0, 0] + [1] * 20
    repeated = repeated_positions(ids, 3)
    # The first 3-gram that occurred before ends at the second loop's third token (position 3 + 5 + 2 = 10).
    assert repeated.tolist() == [False] * 10 + [True] * 13
    assert repeated_positions(ids, 5).tolist() == [False] * 12 + [True] * 11
    every = sample_anchors(ids, mask, 64, seed=0)
    new = sample_anchors(ids, mask, 64, seed=0, skip_repeated=3)
    assert every.tolist() == list(range(3, 22)) and new.tolist() == list(range(3, 10))
    batch = CarryoverDataCollator(num_anchors=64, skip_repeated=3)([{"input_ids": ids, "loss_mask": mask}])
    assert batch["anchors"][0][batch["anchor_mask"][0]].tolist() == list(range(3, 10))
    with pytest.raises(ValueError, match="skip_repeated"):
        CarryoverDataCollator(skip_repeated=-1)


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
    block_mask = backend_mask(packed, "flex_attention", torch.float32)
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(2, 2, mask.shape[-2], 8, generator=generator)
    key, value = (torch.randn(2, 2, mask.shape[-1], 8, generator=generator) for _ in range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = flex_attention(query, key, value, block_mask=block_mask)
    sdpa = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    torch.testing.assert_close(flex, sdpa, atol=1e-5, rtol=1e-5)


def _random_packing(generator, batch=2, num_blocks=4, size=4, length=14, num_carry=7):
    """Blocks at random anchors; carry rows with random owners, positions and validity (some invalid)."""
    anchors = torch.randint(0, length - size + 1, (batch, num_blocks), generator=generator)
    if not num_carry:
        return PackedBlocks(anchors, size, length)
    owner = torch.randint(0, num_blocks, (batch, num_carry), generator=generator)
    valid = torch.rand(batch, num_carry, generator=generator) > 0.3
    valid[:, 0] = False  # at least one invalid carry row
    positions = torch.gather(anchors, 1, owner) + torch.randint(1, size, (batch, num_carry), generator=generator)
    return PackedBlocks(anchors, size, length, owner, valid, positions)


def _reference_mask(packed, causal, window):
    """The rules of the module docstring, entry by entry."""
    T, R, B = packed.context_length, packed.num_carry, packed.block_size
    mask = torch.zeros(packed.anchors.shape[0], packed.num_block_rows, packed.num_keys, dtype=torch.bool)
    for b in range(mask.shape[0]):
        for q in range(packed.num_block_rows):
            block, anchor = q // B, int(packed.anchors[b, q // B])
            q_pos = anchor + q % B
            for k in range(packed.num_keys):
                if k < T:
                    seen, k_pos = k < anchor, k
                elif k < T + R:
                    r = k - T
                    seen = int(packed.carry_owner[b, r]) == block and bool(packed.carry_valid[b, r])
                    k_pos = int(packed.carry_positions[b, r])
                else:
                    j = k - T - R
                    seen = j // B == block and (not causal or j <= q)
                    k_pos = int(packed.anchors[b, j // B]) + j % B
                mask[b, q, k] = seen and (window is None or k_pos > q_pos - window)
    return mask[:, None]


def _flex_visibility(block_mask, shape):
    """Which keys each query sees under `block_mask`, read entry by entry from uncompiled flex attention.

    Equal scores and one-hot values make query q's output row the uniform distribution over the keys it sees.
    """
    import warnings

    from torch.nn.attention.flex_attention import flex_attention

    batch, _, num_q, num_k = shape
    query = torch.zeros(batch, 1, num_q, num_k)
    key = torch.zeros(batch, 1, num_k, num_k)
    value = torch.eye(num_k).expand(batch, 1, -1, -1).contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return flex_attention(query, key, value, block_mask=block_mask) > 0


CASES = [
    pytest.param(dict(), False, None, id="dflash"),
    pytest.param(dict(), True, None, id="verify"),
    pytest.param(dict(), True, 3, id="verify-window"),
    pytest.param(dict(num_carry=0), True, 5, id="verify-window-no-carry"),
    pytest.param(dict(num_carry=0), False, None, id="dflash-no-carry"),
    pytest.param(dict(num_carry=10, size=5), False, 4, id="carry-window"),
]


@pytest.mark.parametrize("shape, causal, window", CASES)
def test_derived_forms_agree_entry_by_entry(shape, causal, window):
    """Dense boolean (sdpa), additive (eager) and flex `BlockMask` forms of one description agree with each other and
    with the rules written out entry by entry, on random packings with valid and invalid carry rows."""
    generator = torch.Generator().manual_seed(11)
    for _ in range(3):
        packed = _random_packing(generator, **shape)
        description = BlockSparseMask(packed, causal=causal, sliding_window=window)
        dense = description.dense()
        assert dense.shape == description.shape and dense.dtype == torch.bool
        assert torch.equal(dense, _reference_mask(packed, causal, window))
        assert torch.equal(backend_mask(packed, "sdpa", torch.float32, causal, window), dense)
        for dtype in (torch.float32, torch.bfloat16):
            additive = backend_mask(packed, "eager", dtype, causal, window)
            assert additive.dtype == dtype and torch.equal(additive == 0, dense)
            assert (additive[~dense] == torch.finfo(dtype).min).all()
        block_mask = backend_mask(packed, "flex_attention", torch.float32, causal, window)
        assert torch.equal(_flex_visibility(block_mask, description.shape), dense)


def test_flex_block_mask_skips_tiles_on_a_long_packing():
    """At a size with several 128-row tiles, the `BlockMask` skips empty tiles, takes full ones whole, and still
    encodes the dense mask entry by entry."""
    generator = torch.Generator().manual_seed(3)
    size, num_blocks, length = 16, 16, 320
    anchors = torch.sort(torch.randint(0, length - size + 1, (1, num_blocks), generator=generator)).values
    anchors[0, -1] = length - size  # the last blocks see the whole context: full context tiles
    packed = PackedBlocks(anchors, size, length)
    for causal, window in ((False, None), (True, None), (True, 100)):
        description = BlockSparseMask(packed, causal=causal, sliding_window=window)
        block_mask = description.block_mask()
        tiles = block_mask.to_dense()
        assert not tiles.all()  # some tiles are skipped
        if window is None:
            assert block_mask.full_kv_num_blocks.sum() > 0  # some are full: no predicate evaluated there
        assert torch.equal(_flex_visibility(block_mask, description.shape), description.dense())


@pytest.mark.parametrize("shape, causal, window", CASES)
def test_mask_mod_pointwise_equals_dense(shape, causal, window):
    """The predicate evaluated on one (b, h, q_idx, kv_idx) at a time, as flex attention does, gives the dense mask;
    so does flex attention's own vmap over it."""
    from torch.nn.attention.flex_attention import create_mask

    packed = _random_packing(torch.Generator().manual_seed(5), **shape)
    description = BlockSparseMask(packed, causal=causal, sliding_window=window)
    dense = description.dense()
    mask_mod = description.mask_mod
    batch, _, num_q, num_k = description.shape
    pointwise = torch.zeros_like(dense)
    for b in range(batch):
        for q in range(num_q):
            for k in range(num_k):
                value = mask_mod(torch.tensor(b), torch.tensor(0), torch.tensor(q), torch.tensor(k))
                assert value.shape == () and value.dtype == torch.bool
                pointwise[b, 0, q, k] = value
    assert torch.equal(pointwise, dense)
    assert torch.equal(create_mask(mask_mod, batch, None, num_q, num_k, device="cpu"), dense)


def test_sliding_window_over_carry_rows_needs_their_positions():
    packed = _random_packing(torch.Generator().manual_seed(0))
    packed.carry_positions = None
    block_sparse_mask(packed)  # without a window positions are not needed
    with pytest.raises(ValueError, match="carry_positions"):
        block_sparse_mask(packed, sliding_window=3)


def test_eager_drafter_takes_the_boolean_mask_as_the_additive_one():
    """`CarryoverDrafterModel.forward` turns a boolean mask into the additive one for eager attention (through the
    same `additive_mask`), so eager with either form and sdpa with the boolean form agree."""
    from carryover_hf.tools.testing import tiny_drafter, tiny_target

    target = tiny_target()
    packed = _random_packing(torch.Generator().manual_seed(2), batch=1, num_blocks=3, size=4, length=10, num_carry=5)
    generator = torch.Generator().manual_seed(0)
    width = target.config.hidden_size
    sdpa = tiny_drafter(target, block_size=4)
    eager = tiny_drafter(target, block_size=4, attn_implementation="eager")
    width_in = sdpa.fc.weight.shape[1]
    inputs = dict(
        block_embeds=torch.randn(1, packed.num_block_rows, width, generator=generator),
        block_position_ids=packed.block_position_ids(),
        context_features=torch.randn(1, packed.context_length, width_in, generator=generator),
        context_position_ids=torch.arange(packed.context_length)[None],
        carry_features=torch.randn(1, packed.num_carry, width_in, generator=generator),
        carry_position_ids=packed.carry_positions,
    )
    mask = block_sparse_mask(packed)
    with torch.no_grad():
        reference = sdpa(**inputs, attention_mask=mask).last_hidden_state
        from_bool = eager(**inputs, attention_mask=mask).last_hidden_state
        from_additive = eager(**inputs, attention_mask=additive_mask(mask, torch.float32)).last_hidden_state
        derived = eager(**inputs, attention_mask=backend_mask(packed, "eager", torch.float32)).last_hidden_state
    assert torch.equal(from_bool, from_additive) and torch.equal(from_additive, derived)
    torch.testing.assert_close(from_bool, reference, atol=1e-5, rtol=1e-5)
