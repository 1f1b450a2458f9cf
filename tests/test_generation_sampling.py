"""Sampling with a Carryover drafter keeps the target's output distribution exactly.

The target's exact distribution over the next few tokens is enumerated (vocabulary 8, 4 new tokens: 4096 sequences
in one batched forward, through the same logits processors `generate` applies), and the tokens sampled with the
drafter are compared with it by Pearson chi-square tests. Each test works at significance level 0.001 (cells with an
expected count under 5 pooled); seeds are fixed, so a run is reproducible. A negative control shows that the same
test rejects a drafter that misreports the distribution it sampled from. The controls are marked `slow` (they check
the test's power, not the product): run them with `pytest -m slow` whenever this test or the acceptance code changes.
"""

import itertools
import sys
from collections import Counter

import pytest
import torch
from scipy.stats import chisquare
from transformers import (
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
)

import carryover_hf  # noqa: F401
from carryover_hf.generation import ConfidenceRule, RoundObserver, observing_rounds
from carryover_hf.tools.testing import tiny_drafter, tiny_target


VOCAB, NEW_TOKENS, SAMPLES, ALPHA = 8, 4, 1200, 1e-3
PROMPT = torch.tensor([[1, 5, 2]])
SETTINGS = {
    "temperature": dict(temperature=0.8, top_k=0),
    "top_k+repetition_penalty": dict(temperature=1.0, top_k=6, repetition_penalty=1.3),
}


def _processors(settings: dict) -> LogitsProcessorList:
    """The processors `generate` builds for `settings`, in its order (penalties first, then warpers)."""
    processors = LogitsProcessorList()
    if settings.get("repetition_penalty"):
        processors.append(RepetitionPenaltyLogitsProcessor(settings["repetition_penalty"]))
    if settings.get("temperature", 1.0) != 1.0:
        processors.append(TemperatureLogitsWarper(settings["temperature"]))
    if settings.get("top_k"):
        processors.append(TopKLogitsWarper(settings["top_k"]))
    return processors


@torch.no_grad()
def exact_distribution(target, settings: dict) -> dict[tuple[int, ...], float]:
    """P(t_1..t_4 | prompt) for every continuation, under the processed target distribution."""
    continuations = torch.tensor(list(itertools.product(range(VOCAB), repeat=NEW_TOKENS)))
    sequences = torch.cat([PROMPT.expand(len(continuations), -1), continuations], dim=1)
    logits = target(sequences).logits.float()
    processors, plen = _processors(settings), PROMPT.shape[1]
    log_p = torch.zeros(len(continuations))
    for k in range(NEW_TOKENS):
        step = processors(sequences[:, : plen + k], logits[:, plen + k - 1].clone())
        log_p += step.log_softmax(-1).gather(1, continuations[:, k : k + 1]).squeeze(1)
    return {tuple(c.tolist()): p for c, p in zip(continuations, log_p.exp().tolist())}


def _marginal(distribution: dict, positions: tuple[int, ...]) -> Counter:
    marginal = Counter()
    for sequence, p in distribution.items():
        marginal[tuple(sequence[i] for i in positions)] += p
    return marginal


def chi_square_pvalue(observed: Counter, expected_probs: Counter, n: int) -> float:
    """Pearson chi-square p-value; cells with expected count < 5 are pooled into one."""
    impossible = [c for c in observed if expected_probs.get(c, 0.0) == 0.0]
    assert not impossible, f"sampled {impossible}, which the target gives probability zero"
    cells = sorted(c for c, p in expected_probs.items() if p > 0)
    expected = [expected_probs[c] * n for c in cells]
    counts = [observed.get(c, 0) for c in cells]
    big = [i for i, e in enumerate(expected) if e >= 5]
    small = [i for i, e in enumerate(expected) if e < 5]
    f_exp = [expected[i] for i in big] + ([sum(expected[i] for i in small)] if small else [])
    f_obs = [counts[i] for i in big] + ([sum(counts[i] for i in small)] if small else [])
    scale = sum(f_obs) / sum(f_exp)  # guards against float round-off in the probabilities
    return float(chisquare(f_obs, [e * scale for e in f_exp]).pvalue)


def sample_with_drafter(target, drafter, settings: dict, drafts: Counter | None = None) -> tuple[list[tuple[int, ...]], Counter]:
    """Samples and acceptance lengths; `drafts` (optional) counts draft lengths per round and cut proposals."""
    samples, acceptance = [], Counter()
    kwargs = dict(do_sample=True, max_new_tokens=NEW_TOKENS, attention_mask=torch.ones_like(PROMPT), top_k=0)
    kwargs.update(settings)
    for seed in range(SAMPLES):
        torch.manual_seed(seed)
        output = target.generate(PROMPT, assistant_model=drafter, **kwargs)
        samples.append(tuple(output[0, PROMPT.shape[1] :].tolist()))
        acceptance.update(drafter.last_generation_stats.acceptance_lengths)
        if drafts is not None:
            drafts.update(drafter.last_generation_stats.draft_lengths[:-1])  # the last round may hit the length budget
            drafts["cut"] += drafter.last_generation_stats.stopped_by_confidence
            drafts["skipped"] += drafter.last_generation_stats.skipped_by_backoff
            drafts["lookup"] += drafter.last_generation_stats.lookup_proposals
            drafts["lookup_skipped"] += drafter.last_generation_stats.lookups_skipped_by_backoff
    return samples, acceptance


def assert_matches(samples, distribution):
    n = len(samples)
    for positions in [(1,), (2,), (3,), (1, 2)]:
        observed = Counter(tuple(s[i] for i in positions) for s in samples)
        p_value = chi_square_pvalue(observed, _marginal(distribution, positions), n)
        assert p_value > ALPHA, f"tokens at {positions} deviate from the target distribution (p={p_value:.2e})"


@pytest.fixture(scope="module")
def target():
    return tiny_target("llama", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, seed=11)


@pytest.mark.parametrize(
    "name,drafter_type,use_carryover",
    [("temperature", "dflash", True), ("top_k+repetition_penalty", "markov", True)],
)
def test_sampling_keeps_target_distribution(target, name, drafter_type, use_carryover):
    drafter = tiny_drafter(target, block_size=4, drafter_type=drafter_type, seed=12)
    drafter.generation_config.use_carryover = use_carryover
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS[name])
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(target, SETTINGS[name]))


def test_sampling_keeps_target_distribution_with_adaptive_proposal_length(target):
    """Cut proposals (down to zero drafts: a plain sampled target step) keep the target's distribution exactly."""
    drafter = tiny_drafter(target, block_size=4, seed=12)
    # The config default (per-call options would override it). This random drafter's top probabilities lie between
    # 0.13 and 0.14 (vocabulary 8), so 0.135 cuts some proposals and keeps others.
    drafter.generation_config.draft_confidence_threshold = 0.135
    drafts = Counter()
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS["temperature"], drafts=drafts)
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert drafts["cut"] > 0 and drafts[0] > 0 and drafts[1] + drafts[2] + drafts[3] > 0, drafts
    assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))


def test_sampling_keeps_target_distribution_with_proposal_backoff(target):
    """Rounds skipped by the backoff (plain sampled target steps, chosen from verified tokens only) keep the target's
    distribution exactly."""
    drafter = tiny_drafter(target, block_size=4, seed=12)
    drafter.generation_config.proposal_backoff = 2
    drafts = Counter()
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS["temperature"], drafts=drafts)
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert drafts["skipped"] > 0 and drafts[1] + drafts[2] + drafts[3] > 0, drafts
    assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))


def test_sampling_keeps_target_distribution_with_lookup_drafts(target):
    """Rounds whose drafts are copied from the context (one-hot draft distributions) keep the target's distribution."""
    drafter = tiny_drafter(target, block_size=4, seed=12)
    drafter.generation_config.lookup_drafts = 3
    drafts = Counter()
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS["temperature"], drafts=drafts)
    assert drafts["lookup"] > 0 and acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0
    assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))


def test_sampling_keeps_target_distribution_with_lookup_backoff(target, monkeypatch):
    """Rounds whose lookup the lookup backoff held back (the drafter proposes in them) keep the target's distribution.
    A periodic prompt makes the lookup fire (and fail) in the first rounds already."""
    monkeypatch.setattr(sys.modules[__name__], "PROMPT", torch.tensor([[1, 5, 2, 1, 5, 2]]))
    drafter = tiny_drafter(target, block_size=4, seed=12)
    drafter.generation_config.lookup_drafts = 3
    drafter.generation_config.lookup_backoff = 4
    drafts = Counter()
    samples, acceptance = sample_with_drafter(target, drafter, SETTINGS["temperature"], drafts=drafts)
    assert drafts["lookup"] > 0 and drafts["lookup_skipped"] > 0, drafts
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))


@pytest.mark.parametrize("one_row_on_kernel", [False, True])
def test_sampling_keeps_target_distribution_with_cpu_kernels(target, one_row_on_kernel):
    """Target and drafter on the CPU kernels (`carryover_hf.tools.cpu_kernels`: oneDNN packed linears and the skinny
    kernel, grouped-query attention for the target), with one row on `F.linear` or, as the AMD EPYC chose, on the
    skinny kernel with one weight row per block: the distribution is still exact."""
    import copy

    from carryover_hf.tools.cpu_kernels import SkinnyChoice, apply_cpu_kernels, packed_linears_available, use_skinny_choice

    if not packed_linears_available():
        pytest.skip("this PyTorch build has no oneDNN")
    packed_target = copy.deepcopy(target)
    drafter = tiny_drafter(packed_target, block_size=4, seed=12)
    switched = apply_cpu_kernels(packed_target, drafter)
    if one_row_on_kernel:  # the conftest restores the default after the test
        use_skinny_choice(SkinnyChoice(one_row=True, two_weight_rows=(False, False, False)))
    assert switched["packed_linears"] > 0 and switched["grouped_attention"]
    samples, acceptance = sample_with_drafter(packed_target, drafter, SETTINGS["temperature"])
    assert acceptance[1] > 0 and sum(v for k, v in acceptance.items() if k > 1) > 0, acceptance
    assert_matches(samples, exact_distribution(packed_target, SETTINGS["temperature"]))


@pytest.mark.slow  # a control of the test's power, not of the product: `pytest -m slow`
def test_chi_square_detects_a_misreported_draft_distribution(target):
    """Negative control: drafting greedily while reporting the sampling distribution (a plausible bug) is caught.

    (A near-one-hot report for a greedy draft would be lossless; the bug is a mismatch between the two.)
    """

    class Misreporting(RoundObserver):
        def generation_started(self, generator):
            generator.proposer.do_sample = False  # still returns the (sampling) logits: do_sample set them up

    drafter = tiny_drafter(target, block_size=4, seed=12)
    with observing_rounds(drafter, Misreporting()):
        samples, _ = sample_with_drafter(target, drafter, SETTINGS["temperature"])
    with pytest.raises(AssertionError, match="deviate"):
        assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))


@pytest.mark.slow  # a control of the test's power, not of the product: `pytest -m slow`
def test_chi_square_detects_a_cut_at_the_sampled_token(target):
    """Negative control for the adaptive length: cutting at the first draft whose *sampled* token is unlikely (instead
    of the row's top probability) changes which tokens can be proposed, and the test sees the bias."""

    class CutAtSampledToken(ConfidenceRule):
        def keep(self, drafts, logits):
            log_p = logits.gather(-1, drafts[..., None]).squeeze(-1) - torch.logsumexp(logits, -1)
            low = (log_p[0] < torch.log(torch.tensor(self.threshold))).nonzero()
            return int(low[0, 0]) if low.numel() else drafts.shape[1]

    class SwapRule(RoundObserver):
        def generation_started(self, generator):
            generator.policy.confidence = CutAtSampledToken(generator.policy.confidence.threshold)

    drafter = tiny_drafter(target, block_size=4, seed=12)
    drafter.generation_config.draft_confidence_threshold = 0.125
    with observing_rounds(drafter, SwapRule()):
        samples, _ = sample_with_drafter(target, drafter, SETTINGS["temperature"])
    with pytest.raises(AssertionError, match="deviate"):
        assert_matches(samples, exact_distribution(target, SETTINGS["temperature"]))
