"""A drafter with a reduced draft vocabulary stays lossless (greedy and sampling), and its proposals are the
full-vocabulary computation restricted to the draft ids; the vocabulary survives save/load."""

from collections import Counter

import pytest
import torch
from transformers import AutoModel

import carryover_hf  # noqa: F401
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target

from test_generation_sampling import (
    PROMPT,
    SETTINGS,
    VOCAB as SAMPLING_VOCAB,
    assert_matches,
    exact_distribution,
    sample_with_drafter,
)

VOCAB = 16


def _with_vocabulary(drafter, token_ids, restrict_markov_inputs=False):
    drafter.set_draft_vocabulary(token_ids)
    if drafter.markov_head is not None:
        torch.nn.init.normal_(drafter.markov_head.proj.weight, std=0.5)
        if restrict_markov_inputs:  # W1: a row per draft id plus one shared row (drawn at random: it must matter)
            drafter.restrict_markov_inputs()
            torch.nn.init.normal_(drafter.markov_head.token_embedding.weight, std=0.5)
    return drafter


KINDS = [("dflash", False), ("markov", False), ("markov", True)]


@pytest.mark.parametrize("kind,restricted", KINDS, ids=["dflash", "markov", "markov-restricted-inputs"])
def test_greedy_output_is_identical_with_a_reduced_vocabulary(kind, restricted):
    target = skew_towards_token(tiny_target("llama", vocab_size=VOCAB, seed=1), 3, 0.1)
    # Keep token 3 (which the skewed target emits often, so drafts get accepted) and drop others it produces.
    drafter = _with_vocabulary(
        tiny_drafter(target, block_size=4, drafter_type=kind, seed=2), [0, 2, 3, 5, 8, 13], restricted
    )
    produced, accepted = Counter(), Counter()
    for i in range(8):
        prompt = torch.randint(0, VOCAB, (1, 2 + i), generator=torch.Generator().manual_seed(i))
        kwargs = dict(max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = target.generate(prompt, **kwargs)
        for use_carryover in (True, False):
            drafter.generation_config.use_carryover = use_carryover
            output = target.generate(prompt, assistant_model=drafter, **kwargs)
            assert torch.equal(output, reference), f"prompt {i}, carry={use_carryover}"
            accepted.update(drafter.last_generation_stats.acceptance_lengths)
        produced.update(reference[0, prompt.shape[1] :].tolist())
    outside = set(produced) - {0, 2, 3, 5, 8, 13}
    assert outside, "the target should produce tokens the draft vocabulary lacks"
    assert sum(v for k, v in accepted.items() if k > 1) > 0, accepted  # some drafts were accepted


@pytest.mark.parametrize(
    "name,kind,restricted",
    [("temperature", "dflash", False), ("top_k+repetition_penalty", "markov", False), ("temperature", "markov", True)],
)
def test_sampling_keeps_the_target_distribution_with_a_reduced_vocabulary(name, kind, restricted):
    target = tiny_target("llama", vocab_size=SAMPLING_VOCAB, hidden_size=32, num_hidden_layers=2, seed=11)
    drafter = _with_vocabulary(
        tiny_drafter(target, block_size=4, drafter_type=kind, seed=12), [0, 1, 3, 4, 6], restricted
    )
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS[name])
    assert {2, 5, 7} & {t for s in samples for t in s}, "the target should sample tokens outside the draft set"
    assert sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(target, SETTINGS[name]))


def test_proposals_are_the_full_head_restricted_to_the_draft_ids():
    target = tiny_target("llama", vocab_size=VOCAB, seed=3)
    drafter = tiny_drafter(target, block_size=4, seed=4)
    states = torch.randn(2, 3, drafter.config.hidden_size)
    full = drafter.proposal_logits(states, target.get_output_embeddings())
    ids = torch.tensor([1, 4, 5, 9, 15])
    drafter.set_draft_vocabulary(ids)
    head = drafter.draft_head(target.get_output_embeddings())
    reduced = drafter.proposal_logits(states, head)
    torch.testing.assert_close(reduced[..., ids], full[..., ids])
    assert torch.isinf(reduced[..., [0, 2, 3]]).all()
    proposal = drafter.propose(states, head, torch.zeros(2, dtype=torch.long), return_logits=False)
    assert torch.equal(proposal.tokens, ids[full[..., ids].argmax(-1)])


@pytest.mark.parametrize("draft_ids", [None, [1, 4, 5, 9, 15]], ids=["full", "reduced"])
def test_markov_proposal_takes_the_head_term_of_all_rows_in_one_product(draft_ids, monkeypatch):
    """Row j of a Markov proposal depends on the draft of row j - 1 only through the transition term, so the head
    term of every row is one product (its weight streamed once per proposal, not once per row), or products over
    groups of rows when HEAD_CHUNK_ELEMENTS caps the logits built at once; the drafts and logits are those of the
    reference form (`proposal_logits` row by row with the previous draft)."""
    from carryover_hf import modeling_carryover
    from carryover_hf.modeling_carryover import DraftHead

    target = tiny_target("llama", vocab_size=VOCAB, seed=3)
    drafter = tiny_drafter(target, block_size=4, drafter_type="markov", seed=4)
    if draft_ids is not None:
        drafter.set_draft_vocabulary(draft_ids)
    torch.nn.init.normal_(drafter.markov_head.proj.weight, std=1.0)  # a transition term that changes the argmax
    head = drafter.draft_head(target.get_output_embeddings())
    states = torch.randn(2, 3, drafter.config.hidden_size, generator=torch.Generator().manual_seed(5))
    anchors = torch.tensor([3, 7])

    previous, tokens, logits = anchors, [], []
    for j in range(3):  # the reference: row by row, each with the draft before it
        row = drafter.proposal_logits(states[:, j], head, previous)
        previous = row.argmax(-1)
        tokens.append(previous)
        logits.append(row)
    reference_tokens, reference_logits = torch.stack(tokens, -1), torch.stack(logits, -2)

    rows_per_product = []
    original = DraftHead.__call__

    def counting(self, hidden_states):
        rows_per_product.append(hidden_states.shape[-2] if hidden_states.dim() == 3 else 1)
        return original(self, hidden_states)

    monkeypatch.setattr(DraftHead, "__call__", counting)
    per_row = 2 * head.size  # logits of one row of both sequences
    for budget, expected in ((modeling_carryover.HEAD_CHUNK_ELEMENTS, [3]), (2 * per_row, [2, 1]), (1, [1, 1, 1])):
        monkeypatch.setattr(modeling_carryover, "HEAD_CHUNK_ELEMENTS", budget)
        rows_per_product.clear()
        proposal = drafter.propose(states, head, anchors, return_logits=True)
        assert rows_per_product == expected
        assert torch.equal(proposal.tokens, reference_tokens)
        torch.testing.assert_close(proposal.logits, reference_logits)


def test_draft_vocabulary_is_saved_with_the_weights(tmp_path):
    target = tiny_target("llama", vocab_size=VOCAB, seed=3)
    drafter = tiny_drafter(target, block_size=4, drafter_type="markov", seed=4)
    drafter.set_draft_vocabulary([2, 3, 7])
    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert loaded.config.draft_vocab_size == 3
    assert loaded.draft_token_ids.tolist() == [2, 3, 7]
    assert loaded.markov_head.proj.weight.shape == (3, drafter.config.markov_rank)


@pytest.mark.parametrize("bad,match", [([3, 2], "sorted"), ([1, 1], "sorted"), ([VOCAB], "lie in"), ([], "at least")])
def test_bad_draft_vocabularies_are_refused(bad, match):
    drafter = tiny_drafter(tiny_target("llama", vocab_size=VOCAB, seed=3), block_size=4, seed=4)
    with pytest.raises(ValueError, match=match):
        drafter.set_draft_vocabulary(bad)


def test_markov_inputs_restricted_to_the_draft_vocabulary_keep_their_rows(tmp_path):
    target = tiny_target("llama", vocab_size=VOCAB, seed=3)
    drafter = tiny_drafter(target, block_size=4, drafter_type="markov", seed=4)
    torch.nn.init.normal_(drafter.markov_head.token_embedding.weight, std=0.5)
    drafter.set_draft_vocabulary([2, 3, 7, 11])
    every = torch.arange(VOCAB)
    before = drafter.markov_head(every)
    w1 = drafter.markov_head.token_embedding.weight.detach().clone()
    drafter.restrict_markov_inputs()
    assert drafter.config.markov_input_vocab_size == 4 and drafter.markov_head.token_embedding.weight.shape[0] == 5
    after = drafter.markov_head(every)
    kept = torch.tensor([2, 3, 7, 11])
    torch.testing.assert_close(after[kept], before[kept])  # kept ids: the trained rows
    others = torch.tensor([i for i in range(VOCAB) if i not in kept.tolist()])
    shared = drafter.markov_head.proj(w1[others].mean(0))  # every other id: one row, the mean of those it replaced
    torch.testing.assert_close(after[others], shared.expand(len(others), -1))
    drafter.save_pretrained(tmp_path)
    loaded = AutoModel.from_pretrained(tmp_path)
    assert loaded.config.markov_input_vocab_size == 4
    assert loaded.markov_head.input_token_ids.tolist() == [2, 3, 7, 11]
    torch.testing.assert_close(loaded.markov_head(every), after)


def test_restricting_markov_inputs_needs_a_markov_head_and_valid_ids():
    target = tiny_target("llama", vocab_size=VOCAB, seed=3)
    with pytest.raises(ValueError, match="needs a Markov drafter"):
        tiny_drafter(target, block_size=4, seed=4).restrict_markov_inputs()
    markov = tiny_drafter(target, block_size=4, drafter_type="markov", seed=4)
    with pytest.raises(ValueError, match="no draft vocabulary: pass the token ids"):
        markov.restrict_markov_inputs()
    with pytest.raises(ValueError, match="sorted and unique"):
        markov.restrict_markov_inputs([5, 1])
    with pytest.raises(ValueError, match=r"ids must lie in \[0, 16\)"):
        markov.restrict_markov_inputs([1, VOCAB])
