"""`training.replay`: greedy decoding replayed on recorded rows is the decoding's own sequence of rounds."""

import pytest
import torch

import carryover_hf  # noqa: F401  (installs the generation hook)
from carryover_hf.generation import declare_generation_options
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target
from carryover_hf.training.objectives import DrafterObjective
from carryover_hf.training.replay import anchor_acceptance, decoding_tau, replay_rounds

VOCAB = 16
FULL_BLOCKS = dict(use_carryover=False, round_policy="rules", lookup_drafts=0, proposal_backoff=0,
                   draft_confidence_threshold=0)  # fmt: skip


def test_replay_walks_each_response_segment_from_its_first_token():
    mask = [0, 0, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1]
    tau = [0, 0, 3, 0, 0, 1, 2, 0, 0, 5, 0, 0]
    # segment 1: 2 -> 5 (3 tokens), 5 -> 6, 6 -> 7 (2 capped at the end); segment 2: 9 -> 11 (5 capped to 2)
    assert replay_rounds(tau, mask) == [3, 1, 1, 2]
    # first 3 tokens of each segment: 2 -> 4 (3 capped to 2); 9 -> 11
    assert replay_rounds(tau, mask, max_tokens=3) == [2, 2]


@pytest.mark.parametrize("drafter_type", ["dflash", "markov"])
def test_replayed_rounds_are_the_rounds_of_full_block_greedy_decoding(drafter_type):
    target = declare_generation_options(skew_towards_token(tiny_target("llama", vocab_size=VOCAB, seed=1), 3, 0.5))
    drafter = tiny_drafter(target, block_size=4, drafter_type=drafter_type, seed=2)
    objective = DrafterObjective(target)
    generator = torch.Generator().manual_seed(0)
    rounds_seen, tokens, rounds = 0, 0, 0
    rows = []
    for i in range(6):
        prompt = torch.randint(0, VOCAB, (1, 4 + i), generator=generator)
        kwargs = dict(max_new_tokens=20 + 3 * i, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = target.generate(prompt, **kwargs)
        output = target.generate(prompt, assistant_model=drafter, **kwargs, **FULL_BLOCKS)
        assert torch.equal(output, reference)
        decoded = drafter.last_generation_stats.acceptance_lengths
        mask = [0] * prompt.shape[1] + [1] * (reference.shape[1] - prompt.shape[1])
        row = {"input_ids": reference[0], "loss_mask": torch.tensor(mask)}
        tau = anchor_acceptance(objective, drafter, row).tolist()
        assert replay_rounds(tau, mask) == decoded, f"prompt {i}"
        # Drafting only the anchors a replay of the first 10 tokens reaches gives that replay unchanged.
        assert replay_rounds(anchor_acceptance(objective, drafter, row, 10).tolist(), mask, 10) == replay_rounds(
            tau, mask, 10)  # fmt: skip
        rows.append(row)
        rounds_seen += sum(1 for n in decoded if n > 1)
        tokens, rounds = tokens + sum(decoded), rounds + len(decoded)
    assert 0 < rounds_seen < rounds  # some drafts were accepted, some rejected: the walk is no trivial one
    assert decoding_tau(objective, drafter, rows)[None] == pytest.approx(tokens / rounds)
