"""`round_policy="cost"`: lossless whatever it chooses (plain steps, suffix matches, drafter blocks of any length)."""

from collections import Counter

import pytest
import torch

import carryover_hf  # noqa: F401  (installs the generation hook)
from carryover_hf.compatibility import ASSISTED_LOOP_CROPS_AT_EOS
from carryover_hf.generation import declare_generation_options
from carryover_hf.modeling_carryover import Proposal
from carryover_hf.suffix_cache import SuffixCache
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target

from test_generation_sampling import assert_matches, exact_distribution, sample_with_drafter

VOCAB = 16
# Free verification (full blocks pay), a cost that rises steeply (short proposals or plain steps pay), and each
# round's cost measured from the call's own rounds.
COSTS = {"flat": "flat", "steep": [1.0, 1.6, 2.2, 2.8, 3.4, 4.0, 4.6, 5.2, 5.8, 6.4, 7.0, 7.6, 8.2, 8.8, 9.4, 10.0, 10.6],
         "measured": "measured"}  # fmt: skip


class Plans(carryover_hf.generation.RoundObserver):
    def __init__(self):
        self.kinds = Counter()

    def round_finished(self, input_ids, candidate_ids, candidate_logits):
        self.kinds["drafts" if candidate_ids.shape[1] > input_ids.shape[1] else "plain"] += 1


@pytest.fixture(scope="module")
def targets():
    return [declare_generation_options(skew_towards_token(tiny_target("llama", vocab_size=VOCAB, seed=1), 3, s))
            for s in (0.0, 0.1, 1.0)]  # fmt: skip


@pytest.mark.parametrize("suffix_match", [True, False])
@pytest.mark.parametrize("cost", list(COSTS))
def test_greedy_output_is_identical_under_the_cost_aware_policy(targets, cost, suffix_match):
    """With the suffix match as a source and without it (`suffix_match=False`: the drafter alone, its length chosen
    per round)."""
    outcomes, sources = Counter(), Counter()
    for i in range(18):
        target = targets[i % 3]
        drafter = tiny_drafter(target, block_size=4 if i % 2 else 8, drafter_type="markov" if i % 4 == 1 else "dflash",
                               seed=2)  # fmt: skip
        generator = torch.Generator().manual_seed(50 + i)
        motif = torch.randint(0, VOCAB, (1, 3), generator=generator)
        prompt = torch.cat([motif, torch.randint(0, VOCAB, (1, i % 5), generator=generator), motif], dim=1)
        kwargs = dict(max_new_tokens=8 + (5 * i) % 25, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = target.generate(prompt, **kwargs)
        if i % 3 == 2:  # stop at a token the target emits mid-way
            new = reference[0, prompt.shape[1] :]
            kwargs.update(eos_token_id=int(new[len(new) // 2]), pad_token_id=int(new[len(new) // 2]))
            reference = target.generate(prompt, **kwargs)
            if not ASSISTED_LOOP_CROPS_AT_EOS and prompt[0, -1] == kwargs["eos_token_id"]:
                continue
        output = target.generate(prompt, assistant_model=drafter, round_policy="cost", verification_cost=COSTS[cost],
                                 suffix_match=suffix_match, **kwargs)  # fmt: skip
        assert torch.equal(output, reference), f"prompt {i} differs under the {cost} cost"
        stats = drafter.last_generation_stats
        assert sum(stats.acceptance_lengths) == output.shape[1] - prompt.shape[1] - 1
        sources["lookup"] += stats.lookup_proposals
        sources["drafter"] += sum(1 for n in stats.draft_lengths if n) - stats.lookup_proposals
        sources["plain"] += sum(1 for n in stats.draft_lengths if not n)
        for accepted, drafted in zip(stats.acceptance_lengths, stats.draft_lengths):
            outcomes["zero" if accepted == 1 and drafted else "full" if drafted and accepted == drafted + 1 else "other"] += 1
    assert sources["drafter"] > 0 and outcomes["zero"] > 0 and outcomes["full"] > 0, (sources, outcomes)
    if not suffix_match:
        assert sources["lookup"] == 0, sources  # the drafter is the only source
    elif cost == "flat":
        assert sources["lookup"] > 0, sources  # the repeated motif: suffix matches
    elif cost == "steep":
        assert sources["plain"] > sources["drafter"], sources  # expensive verification of unlikely drafts


def adversary(drafter, reference: torch.LongTensor, kind: str, vocab_size: int = VOCAB):
    """`drafter` made to propose what `kind` says about the target's own greedy continuation `reference`: "right"
    (every draft the target's next token), "wrong" (none) or "alternating" (right, then wrong, proposal by proposal)."""
    calls = []

    def propose(block_states, head, anchor_ids, *, prefix_ids=None, **kwargs):
        rows, start = block_states.shape[-2], prefix_ids.shape[1]
        right = reference[0, start : start + rows]
        right = torch.cat([right, torch.zeros(rows - right.numel(), dtype=right.dtype)])  # past the end: anything
        wrong = (right + 1) % vocab_size
        calls.append(kind)
        use_right = kind == "right" or (kind == "alternating" and len(calls) % 2 == 1)
        return Proposal((right if use_right else wrong).view(1, rows))

    drafter.propose = propose  # this instance only
    return drafter


@pytest.mark.parametrize("cost", list(COSTS))
@pytest.mark.parametrize("kind", ["right", "wrong", "alternating"])
def test_greedy_output_is_identical_with_adversarial_drafters(targets, cost, kind):
    target, prompt = targets[1], torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    kwargs = dict(max_new_tokens=40, do_sample=False, attention_mask=torch.ones_like(prompt))
    reference = target.generate(prompt, **kwargs)
    drafter = adversary(tiny_drafter(target, block_size=8, seed=2), reference, kind)
    output = target.generate(prompt, assistant_model=drafter, round_policy="cost", verification_cost=COSTS[cost],
                             **kwargs)  # fmt: skip
    assert torch.equal(output, reference), f"the {kind} drafter changed the output under the {cost} cost"
    stats = drafter.last_generation_stats
    tokens_per_round = (output.shape[1] - prompt.shape[1] - 1) / stats.num_rounds
    if kind == "right" and cost != "steep":
        assert tokens_per_round > 4, stats.draft_lengths  # a drafter that is always right gets long proposals
    if kind == "wrong" and cost == "steep":
        drafter_rounds = sum(1 for n in stats.draft_lengths if n) - stats.lookup_proposals
        assert drafter_rounds < stats.num_rounds / 4, stats.draft_lengths  # only probes


def test_a_shared_suffix_cache_drafts_a_repeated_answer_from_the_first_call(targets):
    target = targets[0]
    drafter = tiny_drafter(target, block_size=4, seed=2)
    drafter.suffix_cache = SuffixCache()
    prompt = torch.tensor([[1, 7, 4, 9, 12, 5]])
    kwargs = dict(max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(prompt), round_policy="cost",
                  verification_cost=COSTS["steep"])  # fmt: skip
    first = target.generate(prompt, assistant_model=drafter, **kwargs)
    first_rounds = drafter.last_generation_stats.num_rounds
    second = target.generate(prompt, assistant_model=drafter, **kwargs)  # the first call's output is in the cache now
    assert torch.equal(first, second) and torch.equal(first, target.generate(prompt, max_new_tokens=24, do_sample=False,
                                                                              attention_mask=torch.ones_like(prompt)))
    stats = drafter.last_generation_stats
    assert stats.lookup_proposals > 0 and stats.num_rounds < first_rounds
    assert drafter.suffix_cache.num_sequences == 1


def test_bad_policy_options_are_refused_before_generating(targets):
    drafter = tiny_drafter(targets[0], block_size=4, seed=2)
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="round_policy must be one of"):
        targets[0].generate(prompt, assistant_model=drafter, round_policy="fast", max_new_tokens=4)
    with pytest.raises(ValueError, match="verification_cost must be"):
        targets[0].generate(prompt, assistant_model=drafter, round_policy="cost", verification_cost=[0, 1],
                            max_new_tokens=4)  # fmt: skip
    with pytest.raises(ValueError, match="suffix_match must be True, False or None"):
        targets[0].generate(prompt, assistant_model=drafter, round_policy="cost", suffix_match="off", max_new_tokens=4)


@pytest.mark.parametrize("cost", list(COSTS))
def test_sampling_keeps_the_target_distribution_under_the_cost_aware_policy(cost):
    target = declare_generation_options(tiny_target("llama", vocab_size=8, hidden_size=32, num_hidden_layers=2, seed=11))
    drafter = tiny_drafter(target, block_size=4, drafter_type="dflash", seed=12)
    settings = dict(temperature=0.8, top_k=0, round_policy="cost", verification_cost=COSTS[cost])
    samples, acceptance = sample_with_drafter(target, drafter, settings)
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(target, dict(temperature=0.8, top_k=0)))


def test_sampling_keeps_the_target_distribution_with_the_drafter_as_the_only_source():
    """`suffix_match=False`: no lookup round, and the samples still follow the target's distribution."""
    target = declare_generation_options(tiny_target("llama", vocab_size=8, hidden_size=32, num_hidden_layers=2, seed=11))
    drafter = tiny_drafter(target, block_size=4, drafter_type="markov", seed=13)
    settings = dict(temperature=0.8, top_k=0, round_policy="cost", verification_cost="flat", suffix_match=False)
    drafts = Counter()
    samples, acceptance = sample_with_drafter(target, drafter, settings, drafts)
    assert drafts["lookup"] == 0, drafts
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(target, dict(temperature=0.8, top_k=0)))


def test_the_drafters_generation_config_chooses_the_policy_and_a_call_overrides_it(targets, tmp_path):
    from carryover_hf.round_policy import CostAwarePolicy

    target = targets[1]
    drafter = tiny_drafter(target, block_size=4, seed=2)
    drafter.generation_config.round_policy = "cost"
    drafter.save_pretrained(tmp_path)
    drafter = type(drafter).from_pretrained(tmp_path)
    assert drafter.generation_config.round_policy == "cost"  # saved with the drafter, loaded with it

    class Policy(carryover_hf.generation.RoundObserver):
        def generation_started(self, generator):
            self.policy = generator.policy

    prompt = torch.tensor([[1, 2, 3, 4]])
    kwargs = dict(max_new_tokens=6, do_sample=False, attention_mask=torch.ones_like(prompt))
    with carryover_hf.generation.observing_rounds(drafter, Policy()) as seen:
        target.generate(prompt, assistant_model=drafter, **kwargs)
        assert isinstance(seen.policy, CostAwarePolicy)
        target.generate(prompt, assistant_model=drafter, round_policy="rules", **kwargs)
        assert isinstance(seen.policy, carryover_hf.generation.ProposalPolicy)
    with pytest.raises(ValueError, match="round_policy must be one of"):
        drafter.generation_config.round_policy = "fastest"
        target.generate(prompt, assistant_model=drafter, **kwargs)


def test_by_default_a_seed_reproduces_a_sample_and_greedy_calls_go_on_from_earlier_ones(targets, tmp_path, monkeypatch):
    from carryover_hf.round_policy import MeasuredCost, ModelledCost

    monkeypatch.setenv("CARRYOVER_HF_CACHE", str(tmp_path))  # the calibration is timed here, once
    target = targets[1]
    drafter = tiny_drafter(target, block_size=4, seed=2)

    class Policy(carryover_hf.generation.RoundObserver):
        def generation_started(self, generator):
            self.policy = generator.policy

    prompt = torch.tensor([[1, 2, 3, 4, 1, 2]])
    kwargs = dict(max_new_tokens=16, attention_mask=torch.ones_like(prompt), round_policy="cost")
    samples, memories = [], []
    with carryover_hf.generation.observing_rounds(drafter, Policy()) as seen:
        for _ in range(2):  # sampling: a calibrated curve and this call's rounds alone decide
            torch.manual_seed(3)
            samples.append(target.generate(prompt, assistant_model=drafter, do_sample=True, temperature=0.8, **kwargs))
            assert isinstance(seen.policy.cost, ModelledCost)
            memories.append(seen.policy.memory)
        assert torch.equal(samples[0], samples[1]) and memories[0] is not memories[1]
        for _ in range(2):  # greedy: a calibrated curve too, and what earlier calls saw carries over
            target.generate(prompt, assistant_model=drafter, do_sample=False, **kwargs)
            assert isinstance(seen.policy.cost, ModelledCost)
            memories.append(seen.policy.memory)
        target.generate(prompt, assistant_model=drafter, do_sample=False, verification_cost="measured", **kwargs)
        assert isinstance(seen.policy.cost, MeasuredCost) and seen.policy.memory is memories[3]
        assert memories[2] is memories[3] and memories[3].estimates["draft"].reached[0] > 0
        torch.manual_seed(3)  # a call that asks for measured costs goes on from earlier calls at its own temperature
        target.generate(prompt, assistant_model=drafter, do_sample=True, temperature=0.8, verification_cost="measured",
                        **kwargs)  # fmt: skip
        assert isinstance(seen.policy.cost, MeasuredCost) and seen.policy.memory is not memories[3]
