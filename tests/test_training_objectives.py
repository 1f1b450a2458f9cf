"""The packed training objectives compute what inference computes, anchor by anchor.

The reference below runs, for every anchor separately and without any packing mask, the steps of SPEC section 2 the
way `CarryoverCandidateGenerator` runs them: the drafter sees context rows at positions < anchor, carry rows at the
positions where they were verified, and its block; verification is a plain target forward over the prefix plus the
drafts. The packed objective must give the same loss and the same first-draft acceptance (float32, rtol 1e-4).
"""

import pytest
import torch

import carryover_hf  # noqa: F401
from carryover_hf.features import gather_target_features, hidden_state_indices
from carryover_hf.tools.testing import tiny_drafter, tiny_target
from carryover_hf.training import CarryoverDataCollator, DrafterObjective
from carryover_hf.training.losses import position_weights
from carryover_hf.training.synthetic import regenerate_random_prompts

GAMMA = 3.0


def _features(target, ids, layer_ids):
    out = target(ids[None], output_hidden_states=hidden_state_indices(layer_ids))
    return gather_target_features(out.hidden_states, layer_ids)[0]


def _draft_states(target, drafter, ids, anchor, carry=None, carry_positions=None):
    """One proposal exactly as the candidate generator makes it (no mask, no packing)."""
    config = drafter.config
    block = torch.full((1, config.block_size), config.mask_token_id)
    block[0, 0] = ids[anchor]
    context = _features(target, ids[:anchor], config.target_layer_ids)[None] if anchor > 0 else None
    out = drafter(
        block_embeds=target.get_input_embeddings()(block),
        block_position_ids=torch.arange(anchor, anchor + config.block_size)[None],
        context_features=context,
        context_position_ids=torch.arange(anchor)[None],
        carry_features=carry,
        carry_position_ids=carry_positions,
    )
    return out.last_hidden_state[0]


def _row_labels(ids, loss_mask, anchor, size):
    labels, valid, alive = [], [], True
    for j in range(1, size):
        p = anchor + j
        alive = alive and p < len(ids) and bool(loss_mask[p])
        labels.append(int(ids[min(p, len(ids) - 1)]))
        valid.append(alive)
    return torch.tensor(labels), torch.tensor(valid)


def _block_loss(target, drafter, hidden, ids, anchor, labels, valid):
    lm_head = target.get_output_embeddings()
    previous = torch.cat([ids[anchor : anchor + 1], labels[:-1]]) if drafter.markov_head is not None else None
    logits = drafter.proposal_logits(hidden[1:], lm_head, previous)
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    weights = position_weights(drafter.config.block_size, GAMMA)
    return (ce * valid * weights).sum() / weights.sum()


def _greedy(target, drafter, hidden, first_token):
    logits = drafter.proposal_logits(hidden[1:], target.get_output_embeddings())
    drafts, previous = [], first_token
    for j in range(logits.shape[0]):
        row = logits[j] + (drafter.markov_head(previous).float() if drafter.markov_head is not None else 0)
        previous = row.argmax()
        drafts.append(previous)
    return torch.stack(drafts)


def _corrupt(labels: torch.Tensor, row: int) -> torch.Tensor:
    """The recorded continuation with the draft at `row` changed: `row` drafts are accepted (all of them for B-1)."""
    drafts = labels.clone()
    if row < drafts.shape[-1]:
        drafts[..., row] = (drafts[..., row] + 1) % 64
    return drafts


class ForcedDrafts(DrafterObjective):
    """First drafts with a chosen acceptance per anchor slot k: m = k mod B (so m spans 0 .. B-1)."""

    def first_drafts(self, drafter, hidden, blocks, labels):
        size = drafter.config.block_size
        return torch.stack([_corrupt(labels[:, k], k % size) for k in range(labels.shape[1])], dim=1)


def reference(target, drafter, ids, loss_mask, anchor, objective, forced_row=None):
    """(loss of the trained draft, first-draft acceptance m) for one anchor."""
    size = drafter.config.block_size
    labels, valid = _row_labels(ids, loss_mask, anchor, size)
    hidden = _draft_states(target, drafter, ids, anchor)
    if objective == "dflash":
        return _block_loss(target, drafter, hidden, ids, anchor, labels, valid), None
    if forced_row is None:
        drafts = _greedy(target, drafter, hidden, ids[anchor])
    else:
        drafts = _corrupt(labels, forced_row)
    hits = (drafts == labels) & valid
    m = int(torch.cumprod(hits.long(), 0).sum())
    verified = _features(target, torch.cat([ids[: anchor + 1], drafts]), drafter.config.target_layer_ids)[anchor:]
    second = anchor + m + 1
    if second >= len(ids) or not loss_mask[second]:
        return torch.tensor(0.0), m
    carry = verified[m + 1 :][None] if m < size - 1 else None
    carry_positions = torch.arange(second, anchor + size)[None] if carry is not None else None
    hidden = _draft_states(target, drafter, ids, second, carry, carry_positions)
    labels, valid = _row_labels(ids, loss_mask, second, size)
    return _block_loss(target, drafter, hidden, ids, second, labels, valid), m


def _rows(target):
    rows = regenerate_random_prompts(target, num_rows=3, prompt_length=5, response_length=20, seed=3)
    # Different lengths (padding) and a response that ends before the sequence does.
    return [dict(rows[0]), {**rows[1], "input_ids": rows[1]["input_ids"][:18], "loss_mask": rows[1]["loss_mask"][:18]},
            {**rows[2], "loss_mask": rows[2]["loss_mask"][:-4] + [0] * 4}]  # fmt: skip


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
@pytest.mark.parametrize("objective", ["dflash", "carryover"])
def test_packed_objective_equals_per_anchor_inference(objective, drafter_type):
    target = tiny_target("qwen3", seed=1)
    drafter = tiny_drafter(target, block_size=5, drafter_type=drafter_type, seed=2)
    rows = _rows(target)
    batch = CarryoverDataCollator(num_anchors=6, seed=0)(rows)
    output = DrafterObjective(target, objective, GAMMA)(drafter, drafter, batch)

    expected_loss, accepted = torch.tensor(0.0), []
    for b, row in enumerate(rows):
        ids, mask = torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"])
        for anchor in batch["anchors"][b][batch["anchor_mask"][b]].tolist():
            loss, m = reference(target, drafter, ids, mask, anchor, objective)
            expected_loss += loss
            accepted.append(m)
    assert int(output.num_anchors) == len(accepted) == 18
    torch.testing.assert_close(output.loss_sum, expected_loss, rtol=1e-4, atol=1e-5)
    if objective == "carryover":
        first_tau, count = output.metrics["first_draft_tau"]
        assert float(first_tau) == sum(m + 1 for m in accepted) and int(count) == len(accepted)
        carry_rows, _ = output.metrics["carry_rows"]
        assert float(carry_rows) == sum(drafter.config.block_size - 1 - m for m in accepted)


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_carry_segments_of_every_length(drafter_type):
    """First drafts accepted 0 .. B-1 times: carry segments from B-1 rows down to none, and second anchors that run
    past the end of the response."""
    target = tiny_target("llama", seed=4)
    drafter = tiny_drafter(target, block_size=5, drafter_type=drafter_type, seed=5)
    rows = _rows(target)
    batch = CarryoverDataCollator(num_anchors=6, seed=1)(rows)
    output = ForcedDrafts(target, "carryover", GAMMA)(drafter, drafter, batch)

    expected_loss, accepted = torch.tensor(0.0), []
    for b, row in enumerate(rows):
        ids, mask = torch.tensor(row["input_ids"]), torch.tensor(row["loss_mask"])
        for k, anchor in enumerate(batch["anchors"][b][batch["anchor_mask"][b]].tolist()):
            loss, m = reference(target, drafter, ids, mask, anchor, "carryover", forced_row=k % 5)
            expected_loss += loss
            accepted.append(m)
    assert set(accepted) == {0, 1, 2, 3, 4}
    torch.testing.assert_close(output.loss_sum, expected_loss, rtol=1e-4, atol=1e-5)
    assert float(output.metrics["first_draft_tau"][0]) == sum(m + 1 for m in accepted)


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_carryover_with_the_plain_loss_adds_the_first_drafts_dflash_loss(drafter_type):
    """`plain_weight`: the carryover loss plus that weight times the dflash loss of the same anchors' first draft, and
    its gradient is the sum of the two objectives' gradients."""
    target = tiny_target("qwen3", seed=1)
    drafter = tiny_drafter(target, block_size=5, drafter_type=drafter_type, seed=2)
    batch = CarryoverDataCollator(num_anchors=6, seed=0)(_rows(target))

    def loss_and_grads(objective, **options):
        drafter.zero_grad()
        output = DrafterObjective(target, objective, GAMMA, **options)(drafter, drafter, batch)
        output.loss_sum.backward()
        return output.loss_sum.detach(), {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None}

    mixed, mixed_grads = loss_and_grads("carryover", plain_weight=0.5)
    carryover, carryover_grads = loss_and_grads("carryover")
    plain, plain_grads = loss_and_grads("dflash")
    torch.testing.assert_close(mixed, carryover + 0.5 * plain, rtol=1e-5, atol=1e-6)
    assert mixed_grads.keys() == carryover_grads.keys()
    for name, grad in mixed_grads.items():
        expected = carryover_grads[name] + 0.5 * plain_grads.get(name, torch.zeros_like(grad))
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-6, msg=name)
    with pytest.raises(ValueError, match="plain_weight"):
        DrafterObjective(target, "carryover", plain_weight=-1.0)
