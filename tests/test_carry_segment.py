"""What the carry segment holds, where it goes, and that incremental proposals equal recomputed ones."""

import pytest
import torch
from transformers import GenerationConfig

import carryover_hf  # noqa: F401
from carryover_hf.features import gather_target_features, hidden_state_indices
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


ATOL = 1e-5  # fp32: incremental and from-scratch passes differ only by summation order


class Recorder:
    """Records every drafter proposal (inputs, outputs, context-cache length) and every target verify pass."""

    def __init__(self, target, drafter):
        self.proposals, self.verifications = [], []
        self.handles = [
            drafter.register_forward_hook(self._on_draft, with_kwargs=True),
            target.register_forward_hook(self._on_verify, with_kwargs=True),
        ]

    def _on_draft(self, module, args, kwargs, output):
        self.proposals.append(
            dict(
                kwargs={k: v.clone() if torch.is_tensor(v) else v for k, v in kwargs.items()},
                hidden=output.last_hidden_state.clone(),
                cache_length=kwargs["past_key_values"].get_seq_length(),
                verifications_before=len(self.verifications),
            )
        )

    def _on_verify(self, module, args, kwargs, output):
        self.verifications.append(dict(input_ids=kwargs["input_ids"].clone(), hidden_states=output.hidden_states))

    def close(self):
        for handle in self.handles:
            handle.remove()


def _run(target, drafter, prompt, max_new_tokens=40, **options):
    recorder = Recorder(target, drafter)
    try:
        output = target.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            assistant_model=drafter,
            generation_config=GenerationConfig(
                max_new_tokens=max_new_tokens, do_sample=False, return_dict_in_generate=True, **options
            ),
        )
    finally:
        recorder.close()
    return output, recorder


@pytest.fixture(scope="module")
def setup():
    target = tiny_target("qwen3", vocab_size=16, seed=21)
    drafter = tiny_drafter(target, block_size=6, num_hidden_layers=2, seed=22)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    return target, drafter, prompt


def test_carry_rows_are_the_verified_states_of_rejected_drafts(setup):
    target, drafter, prompt = setup
    output, rec = _run(target, drafter, prompt)
    layer_ids = drafter.config.target_layer_ids
    stats = drafter.last_generation_stats
    # The prefill, one verification per proposal, and one per round whose length budget left no drafts.
    assert len(rec.verifications) == len(rec.proposals) + 1 + stats.draft_lengths.count(0)
    checked = 0
    for r in range(1, len(rec.proposals)):
        verify = rec.verifications[r]  # verification r checked proposal r - 1 (verification 0 is the prefill)
        accepted = stats.acceptance_lengths[r - 1] - 1
        carry = rec.proposals[r]["kwargs"]["carry_features"]
        rejected = verify["input_ids"].shape[1] - 1 - accepted
        if rejected == 0:
            assert carry is None
            continue
        verified = gather_target_features(verify["hidden_states"], layer_ids)
        assert torch.equal(carry, verified[:, accepted + 1 :])
        # Independently: a plain target forward over committed prefix + the rejected drafts gives the same states.
        anchor_pos = rec.proposals[r - 1]["kwargs"]["block_position_ids"][0, 0].item()
        sequence = torch.cat([output.sequences[:, :anchor_pos], verify["input_ids"]], dim=1)
        full = target(sequence, output_hidden_states=hidden_state_indices(layer_ids)).hidden_states
        torch.testing.assert_close(carry, gather_target_features(full, layer_ids)[:, anchor_pos + accepted + 1 :], atol=ATOL, rtol=0)
        # Keys of carry rows sit at the positions where they were verified.
        positions = rec.proposals[r]["kwargs"]["carry_position_ids"]
        assert positions[0].tolist() == list(range(anchor_pos + accepted + 1, anchor_pos + accepted + 1 + rejected))
        checked += 1
    assert checked > 0


def test_carry_is_empty_after_full_acceptance():
    target = skew_towards_token(tiny_target("llama", vocab_size=16, seed=1), 3, 1.0)
    drafter = tiny_drafter(target, block_size=4, seed=2)
    _, rec = _run(target, drafter, torch.tensor([[5, 6, 7]]))
    stats = drafter.last_generation_stats
    full_rounds = [r for r, (a, d) in enumerate(zip(stats.acceptance_lengths, stats.draft_lengths)) if a == d + 1]
    assert full_rounds, "the skewed target should accept some proposals in full"
    for r in full_rounds:
        if r + 1 < len(rec.proposals):
            assert rec.proposals[r + 1]["kwargs"]["carry_features"] is None
            assert stats.carry_rows[r + 1] == 0


def test_carry_never_enters_a_cache(setup):
    target, drafter, prompt = setup
    output, rec = _run(target, drafter, prompt)
    for proposal in rec.proposals:
        # The drafter cache holds exactly the committed rows before the anchor: no carry, no block rows.
        anchor_pos = proposal["kwargs"]["block_position_ids"][0, 0].item()
        assert proposal["cache_length"] == anchor_pos
    assert max(drafter.last_generation_stats.carry_rows) > 0
    # The target's cache holds the committed sequence only (the last token has not been processed yet).
    assert output.past_key_values.get_seq_length() == output.sequences.shape[1] - 1


@pytest.mark.parametrize("attn_implementation", ["sdpa", "eager"])
def test_incremental_proposal_equals_recomputed_proposal(attn_implementation):
    target = tiny_target("llama", vocab_size=16, seed=31)
    drafter = tiny_drafter(target, block_size=5, num_hidden_layers=2, seed=32, attn_implementation=attn_implementation)
    output, rec = _run(target, drafter, torch.tensor([[2, 7, 1, 8, 2, 8]]), max_new_tokens=30)
    layer_ids = drafter.config.target_layer_ids
    with_carry = 0
    for proposal in rec.proposals:
        kwargs = proposal["kwargs"]
        anchor_pos = kwargs["block_position_ids"][0, 0].item()
        # From scratch: one target pass over the committed prefix gives every context row; no cache.
        prefix = output.sequences[:, :anchor_pos]
        context = gather_target_features(target(prefix, output_hidden_states=hidden_state_indices(layer_ids)).hidden_states, layer_ids)
        recomputed = drafter(
            block_embeds=kwargs["block_embeds"],
            block_position_ids=kwargs["block_position_ids"],
            context_features=context,
            context_position_ids=torch.arange(anchor_pos).unsqueeze(0),
            carry_features=kwargs["carry_features"],
            carry_position_ids=kwargs["carry_position_ids"],
        ).last_hidden_state
        torch.testing.assert_close(proposal["hidden"], recomputed, atol=ATOL, rtol=0)
        with_carry += kwargs["carry_features"] is not None
    assert with_carry > 0


def test_eager_and_sdpa_drafters_agree():
    target = tiny_target("llama", vocab_size=16, seed=41)
    outputs = {}
    for impl in ("eager", "sdpa"):
        drafter = tiny_drafter(target, block_size=4, num_hidden_layers=2, seed=42, attn_implementation=impl)
        generated = target.generate(torch.tensor([[1, 2, 3]]), assistant_model=drafter, max_new_tokens=25, do_sample=False)
        outputs[impl] = (generated, drafter.last_generation_stats.acceptance_lengths)
    assert torch.equal(outputs["eager"][0], outputs["sdpa"][0])
    assert outputs["eager"][1] == outputs["sdpa"][1]


@pytest.mark.parametrize(
    "target_seed, options", [(21, dict(proposal_backoff=4)), (22, dict(lookup_drafts=6))], ids=["backoff", "lookup"]
)
def test_rounds_without_the_drafter_hand_it_every_verified_row_later(setup, target_seed, options):
    """Rounds skipped by `proposal_backoff` (plain steps) and rounds proposed by `lookup_drafts` run no drafter
    forward; the next proposal takes all rows verified since the last one (contiguous positions, the cache then holds
    exactly the committed rows), carries nothing after such a round, and drafts what a proposal from a drafter fed
    round by round drafts."""
    _, drafter, prompt = setup
    # (seed 22 alternates lookups and drafter proposals on this prompt; the fixture's target soon loops for good)
    target = tiny_target("qwen3", vocab_size=16, seed=target_seed)
    output, rec = _run(target, drafter, prompt, max_new_tokens=48, **options)
    stats = drafter.last_generation_stats
    without_drafter = stats.skipped_by_backoff + stats.lookup_proposals
    assert without_drafter > 0 and (stats.lookup_proposals > 0) == ("lookup_drafts" in options)
    assert len(rec.proposals) == len(stats.carry_rows)
    # Every round is a drafter proposal, a round without it, or the final plain step when the budget leaves no room.
    assert len(stats.draft_lengths) - without_drafter - len(rec.proposals) in (0, 1)
    cached = 0
    for proposal in rec.proposals:
        kwargs = proposal["kwargs"]
        anchor_pos = kwargs["block_position_ids"][0, 0].item()
        # New context: every row since the previous proposal; the cache then holds exactly the committed rows.
        assert kwargs["context_position_ids"][0].tolist() == list(range(cached, anchor_pos))
        assert proposal["cache_length"] == anchor_pos
        cached = anchor_pos
    # A proposal right after a round the drafter did not propose sees no carry (a plain step rejects nothing; a
    # lookup's rejected rows are not carried).
    after_skip = [p for previous, p in zip(rec.proposals, rec.proposals[1:])
                  if previous["verifications_before"] != p["verifications_before"] - 1]  # fmt: skip
    assert after_skip and all(p["kwargs"]["carry_features"] is None for p in after_skip)
    # The block states equal a from-scratch pass over the whole committed context (carry included as given).
    checked = 0
    for proposal in rec.proposals[1:]:
        kwargs = proposal["kwargs"]
        anchor_pos = kwargs["block_position_ids"][0, 0].item()
        sequence = output.sequences[:, :anchor_pos]
        full = target(sequence, output_hidden_states=hidden_state_indices(drafter.config.target_layer_ids)).hidden_states
        fresh = drafter(
            block_embeds=kwargs["block_embeds"], block_position_ids=kwargs["block_position_ids"],
            context_features=gather_target_features(full, drafter.config.target_layer_ids),
            context_position_ids=torch.arange(anchor_pos)[None], carry_features=kwargs["carry_features"],
            carry_position_ids=kwargs["carry_position_ids"],
        ).last_hidden_state  # fmt: skip
        torch.testing.assert_close(proposal["hidden"], fresh, atol=ATOL, rtol=0)
        checked += 1
    assert checked > 2
