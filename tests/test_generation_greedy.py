"""Greedy generation with a Carryover drafter is token-identical to the target's own greedy generation."""

from collections import Counter

import pytest
import torch

import carryover_hf  # noqa: F401  (installs the generation hook)
from carryover_hf.compatibility import ASSISTED_LOOP_CROPS_AT_EOS
from carryover_hf.tools.testing import skew_towards_token, tiny_drafter, tiny_target


ARCHITECTURES = ["llama", "qwen3", "gemma"]
VOCAB = 16
NUM_PROMPTS = 20
# A random target rarely agrees with a random drafter; LM heads skewed towards one token agree partly (mild) or over
# long runs (strong), so the suite meets zero, partial and full acceptance.
SKEWS = (0.0, 0.1, 1.0)


def _prompt(i: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + i)
    return torch.randint(0, VOCAB, (1, 1 + i % 11), generator=generator)


@pytest.fixture(scope="module")
def targets():
    """Per architecture: one random target per skew strength."""
    return {
        arch: [skew_towards_token(tiny_target(arch, vocab_size=VOCAB, seed=1), 3, strength) for strength in SKEWS]
        for arch in ARCHITECTURES
    }


def _classify(stats) -> Counter:
    outcome = Counter()
    for accepted, drafted in zip(stats.acceptance_lengths, stats.draft_lengths):
        outcome["zero" if accepted == 1 else "full" if accepted == drafted + 1 else "partial"] += 1
    return outcome


COMBINATIONS = [(kind, block) for kind in ("dflash", "markov") for block in (4, 16)]


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_is_identical(targets, arch):
    """20 prompts per architecture, cycling through both drafter kinds and block sizes 4 and 16, carry on and off."""
    drafters = {
        (id(t), kind, block): tiny_drafter(t, block_size=block, drafter_type=kind, seed=2)
        for t in targets[arch]
        for kind, block in COMBINATIONS
    }
    outcomes, stops, combinations = Counter(), Counter(), Counter()
    for i in range(NUM_PROMPTS):
        kind, block = COMBINATIONS[i % len(COMBINATIONS)]
        target = targets[arch][(i // len(COMBINATIONS)) % len(SKEWS)]
        drafter = drafters[(id(target), kind, block)]
        prompt = _prompt(i)
        max_new_tokens = 5 + (7 * i) % 36
        kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, attention_mask=torch.ones_like(prompt))
        reference = target.generate(prompt, **kwargs)
        if i % 3 == 1:
            # Stop at EOS: declare a token the target emits mid-way as end-of-sequence.
            new_tokens = reference[0, prompt.shape[1] :]
            kwargs["eos_token_id"] = int(new_tokens[len(new_tokens) // 2])
            kwargs["pad_token_id"] = kwargs["eos_token_id"]
            reference = target.generate(prompt, **kwargs)
            stops["eos"] += int(reference[0, -1] == kwargs["eos_token_id"])
            if not ASSISTED_LOOP_CROPS_AT_EOS and prompt[0, -1] == kwargs["eos_token_id"]:
                continue  # refused on Transformers 5.17 (test_prompt_ending_with_eos_on_5_17)
        stops["max_new_tokens"] += int(reference.shape[1] - prompt.shape[1] == max_new_tokens)
        for use_carryover in (True, False):
            drafter.generation_config.use_carryover = use_carryover
            output = target.generate(prompt, assistant_model=drafter, **kwargs)
            assert torch.equal(output, reference), f"prompt {i} ({kind}, B={block}, carry={use_carryover}) differs"
            stats = drafter.last_generation_stats
            assert sum(stats.acceptance_lengths) == output.shape[1] - prompt.shape[1] - 1  # prefill adds one token
            outcomes += _classify(stats)
            combinations[(kind, block, use_carryover)] += 1
    assert len(combinations) == 8 and min(combinations.values()) >= 4, combinations
    assert stops["eos"] > 0 and stops["max_new_tokens"] > 0, stops
    assert outcomes["zero"] > 0 and outcomes["partial"] > 0 and outcomes["full"] > 0, outcomes


def test_carry_changes_proposals_but_not_outputs():
    """The same weights with carry on and off are both lossless, but the carry rows change the proposals."""
    target = tiny_target("llama", vocab_size=VOCAB, seed=5)
    drafter = tiny_drafter(target, block_size=8, seed=6)
    prompt = _prompt(3)
    carry_rows, proposals = {}, {}
    for use_carryover in (True, False):
        drafter.generation_config.use_carryover = use_carryover
        seen = []
        handle = drafter.register_forward_hook(lambda m, a, out: seen.append(out.last_hidden_state.clone()))
        target.generate(prompt, assistant_model=drafter, max_new_tokens=30, do_sample=False)
        handle.remove()
        carry_rows[use_carryover] = drafter.last_generation_stats.carry_rows
        proposals[use_carryover] = seen
    assert max(carry_rows[True]) > 0 and max(carry_rows[False]) == 0
    # The first proposal has no carry either way; some later proposal must differ.
    assert torch.equal(proposals[True][0], proposals[False][0])
    assert any(not torch.allclose(a, b) for a, b in zip(proposals[True][1:], proposals[False][1:]))


def _exact_runs(targets, **options):
    """Eight prompts (dflash and markov drafters, several target skews) with these per-call options; each output must
    equal the target alone. Yields each call's statistics."""
    from transformers import GenerationConfig

    for i in range(8):
        kind = ("dflash", "markov")[i % 2]
        target = targets["llama"][(i // 2) % len(SKEWS)]
        drafter = tiny_drafter(target, block_size=8, drafter_type=kind, seed=3)
        prompt = _prompt(i)
        reference = target.generate(prompt, max_new_tokens=24, do_sample=False)
        config = GenerationConfig(max_new_tokens=24, do_sample=False, **options)
        output = target.generate(prompt, assistant_model=drafter, generation_config=config)
        assert torch.equal(output, reference), f"prompt {i} ({kind}, {options}) differs"
        stats = drafter.last_generation_stats
        assert sum(stats.acceptance_lengths) == output.shape[1] - prompt.shape[1] - 1
        yield stats


@pytest.mark.parametrize("threshold", [0.1, 0.25, 0.6])
def test_greedy_output_is_identical_with_adaptive_proposal_length(targets, threshold):
    """`draft_confidence_threshold` only shortens proposals (to zero drafts: a plain target step); outputs stay exact."""
    cut = zero = full = 0
    for stats in _exact_runs(targets, draft_confidence_threshold=threshold):
        assert all(a <= d + 1 for a, d in zip(stats.acceptance_lengths, stats.draft_lengths))
        cut += stats.stopped_by_confidence
        zero += stats.draft_lengths[:-1].count(0)
        full += stats.draft_lengths.count(7)
    assert cut > 0 and zero > 0, (cut, zero)
    if threshold <= 0.25:
        assert full > 0, "some proposals should pass the threshold in full"


@pytest.mark.parametrize("threshold", [None, 0.25])
def test_greedy_output_is_identical_with_proposal_backoff(targets, threshold):
    """`proposal_backoff` turns some rounds into plain target steps (no drafter forward); outputs stay exact."""
    skipped = proposed = 0
    for stats in _exact_runs(targets, proposal_backoff=4, draft_confidence_threshold=threshold):
        skipped += stats.skipped_by_backoff
        proposed += sum(1 for d in stats.draft_lengths if d > 0)
    assert skipped > 0 and proposed > 0, (skipped, proposed)


@pytest.mark.parametrize("backoff", [None, 2])
def test_greedy_output_is_identical_with_lookup_drafts(targets, backoff):
    """`lookup_drafts` proposes copies of the context in some rounds (no drafter forward) and the drafter in the
    others; outputs stay exact, with and without the backoff."""
    lookups = drafter_rounds = long_lookups = 0
    for stats in _exact_runs(targets, lookup_drafts=10, proposal_backoff=backoff):
        lookups += stats.lookup_proposals
        drafter_rounds += len(stats.carry_rows)  # one entry per drafter proposal
        long_lookups += sum(d > 7 for d in stats.draft_lengths)  # longer than the drafter's block allows
    assert lookups > 0 and drafter_rounds > 0 and long_lookups > 0, (lookups, drafter_rounds, long_lookups)


@pytest.mark.parametrize("backoff", [None, 2])
def test_greedy_output_is_identical_with_lookup_backoff(targets, backoff):
    """`lookup_backoff` holds the lookup back after a failed one (the drafter, or its backoff, has those rounds);
    outputs stay exact."""
    lookups = held_back = 0
    for stats in _exact_runs(targets, lookup_drafts=10, lookup_backoff=4, proposal_backoff=backoff):
        lookups += stats.lookup_proposals
        held_back += stats.lookups_skipped_by_backoff
    assert lookups > 0 and held_back > 0, (lookups, held_back)


def test_backoff_skips_doubling_chances_after_failures_up_to_its_limit():
    from carryover_hf.generation import Backoff

    backoff, skipped = Backoff(limit=4), []
    for accepted in [False, False, False, False, True, False]:
        backoff.record(first_draft_accepted=accepted)
        count = 0
        while backoff.skips():
            count += 1
        skipped.append(count)
    assert skipped == [1, 2, 4, 4, 0, 1]
    assert Backoff.of(None) is None and Backoff.of(3).limit == 3


def test_lookup_continuation():
    from carryover_hf.generation import lookup_continuation

    seq = torch.tensor([5, 1, 2, 3, 9, 1, 2, 3, 7, 4, 1, 2, 3])
    assert lookup_continuation(seq, 3).tolist() == [7, 4, 1]  # after the latest earlier occurrence of (1, 2, 3)
    assert lookup_continuation(seq, 7).tolist() == [7, 4, 1, 2, 3, 7, 4]  # period 5: the loop goes on
    assert lookup_continuation(torch.tensor([4, 8, 6, 8, 6]), 5).tolist() == [8, 6, 8, 6, 8]  # (6, 8, 6) is new
    assert lookup_continuation(torch.tensor([7, 7, 7]), 4).tolist() == [7, 7, 7, 7]
    assert lookup_continuation(torch.tensor([1, 2, 3, 4]), 5) is None  # no n-gram repeats
    assert lookup_continuation(torch.tensor([7, 7]), 5) is None  # too short for a 2-gram with a continuation
    assert lookup_continuation(seq, 0) is None


@pytest.mark.parametrize("kind", ["dflash", "markov"])
def test_row_one_first_drafts_what_one_call_drafts(targets, kind):
    """With a threshold the first row is drafted alone, then the rest; when nothing is cut the candidates (tokens and
    logits, after a prefix-dependent processor) are those of one call over all rows."""
    from transformers import GenerationConfig

    from carryover_hf.generation import RoundObserver, observing_rounds

    seen = []

    class Recording(RoundObserver):
        def round_finished(self, input_ids, ids, logits):
            seen.append((ids.clone(), None if logits is None else logits.clone()))

    target = targets["llama"][1]
    drafter = tiny_drafter(target, block_size=6, drafter_type=kind, seed=4)
    runs = []
    for threshold in (None, 1e-9):  # 1e-9 never cuts
        seen.clear()
        config = GenerationConfig(max_new_tokens=16, do_sample=False, repetition_penalty=1.3, output_logits=False,
                                  draft_confidence_threshold=threshold)
        with observing_rounds(drafter, Recording()):
            target.generate(_prompt(5), assistant_model=drafter, generation_config=config)
        runs.append(list(seen))
    assert len(runs[0]) == len(runs[1]) > 2
    for (ids_a, logits_a), (ids_b, logits_b) in zip(*runs):
        assert torch.equal(ids_a, ids_b)
        if logits_a is not None:
            torch.testing.assert_close(logits_b, logits_a, atol=1e-5, rtol=0)


@pytest.mark.skipif(ASSISTED_LOOP_CROPS_AT_EOS, reason="Transformers 5.18+ generates after a prompt ending with EOS")
def test_prompt_ending_with_eos_on_5_17(targets):
    """Transformers 5.17's assisted loop stops before generating when the prompt ends with EOS: refused, not wrong."""
    target = targets["llama"][0]
    drafter = tiny_drafter(target, block_size=4, seed=2)
    prompt = torch.tensor([[1, 2, 5]])
    with pytest.raises(ValueError, match="ends with an end-of-sequence token"):
        target.generate(prompt, assistant_model=drafter, max_new_tokens=4, eos_token_id=5, pad_token_id=5)
