"""The cost-aware round choice: expected tokens per unit of cost, from past rounds only."""

import pytest
import torch

from carryover_hf.round_policy import (
    AcceptanceEstimate,
    MeasuredCost,
    ModelledCost,
    VerificationCost,
    best_proposal,
    calibrate,
)
from carryover_hf.tools.testing import tiny_target


def _estimate(rate: float, rounds: int = 200, max_drafts: int = 8) -> AcceptanceEstimate:
    """An estimate after `rounds` rounds of drafts each accepted with probability `rate` (deterministic counts)."""
    estimate = AcceptanceEstimate(max_drafts)
    for j in range(max_drafts):
        estimate.reached[j] = rounds
        estimate.accepted[j] = rate * rounds
    return estimate


def test_expected_tokens_follow_the_conditional_rates():
    estimate = AcceptanceEstimate(3, prior_accept=0.0, prior_reject=1e-9)
    for drafted, accepted in [(3, 3), (3, 1), (3, 0), (3, 3)]:
        estimate.observe(drafted, accepted)
    # position 1: 3 of 4 accepted; position 2 reached 3 times, accepted 2; position 3 reached 2, accepted 2
    assert estimate.reached == [4, 3, 2] and estimate.accepted == [3, 2, 2]
    rates = estimate.conditional()
    assert rates == pytest.approx([0.75, 2 / 3, 1.0])
    assert estimate.expected_tokens(3) == pytest.approx(1 + 0.75 + 0.5 + 0.5)
    assert AcceptanceEstimate(4).expected_tokens(2) == pytest.approx(1 + 0.5 + 0.25)  # the prior alone


def test_a_longer_suffix_match_starts_from_what_shorter_matches_showed():
    from carryover_hf.round_policy import CostAwarePolicy, suffix_estimate_key
    from carryover_hf.suffix_cache import SuffixCache

    shorter = _estimate(0.9, rounds=50, max_drafts=4)
    longer = AcceptanceEstimate(4, parent=shorter)
    assert longer.conditional() == pytest.approx(shorter.conditional())  # no evidence of its own: the parent's rates
    for _ in range(20):
        longer.observe(4, 0)  # its own evidence wins
    assert longer.conditional()[0] < 0.2
    policy = CostAwarePolicy(4, 1000, VerificationCost.flat(16), SuffixCache().session([1, 2, 3]))
    eight = policy._estimate(suffix_estimate_key(9))
    memory = policy.memory.estimates
    assert suffix_estimate_key(9) == "lookup8" and eight.parent is memory["lookup8"]
    assert memory["lookup8"].parent is memory["lookup4"] and memory["lookup4"].parent is memory["lookup3"]


def test_a_call_starts_from_what_earlier_calls_rounds_showed():
    from carryover_hf.round_policy import AcceptanceMemory, CostAwarePolicy

    cpu = VerificationCost([1.0, 1.1, 1.15, 1.17])
    memory = AcceptanceMemory()
    fresh = CostAwarePolicy(4, 1000, cpu, drafter_cost=0.1, memory=memory)
    assert fresh.estimates["draft"].conditional() == pytest.approx([0.5] * 3)  # nothing seen yet: the Beta prior
    for step in range(30):  # a first call whose drafter never gets a draft accepted
        plan = _plan(fresh, list(range(step + 1)), 0)
        if plan.kind == "draft":
            fresh.drafted(plan.num_drafts)
    proposals = sum(choice.source == "draft" for choice in fresh.choices)
    assert memory.estimates["draft"].conditional()[0] < 0.2
    later = CostAwarePolicy(4, 1000, cpu, drafter_cost=0.1, memory=memory)
    # the next call's first round already knows: a plain step, where a call of its own would try the drafter
    assert _plan(later, [1, 2, 3], 0).kind == "plain"
    assert _plan(CostAwarePolicy(4, 1000, cpu, drafter_cost=0.1), [1, 2, 3], 0).kind == "draft"
    assert proposals >= 3  # probes kept feeding the memory
    for _ in range(40):  # and its own rounds take over: a drafter that is now always right
        later.memory.estimate("draft", 3).observe(3, 3)
        later.estimates["draft"].observe(3, 3)
    assert later.estimates["draft"].conditional()[0] > 0.8


def test_free_verification_takes_full_blocks_and_costly_verification_of_bad_drafts_takes_a_plain_step():
    flat = ModelledCost(VerificationCost.flat(15))
    good = {"drafter": _estimate(0.5, max_drafts=15)}
    choice = best_proposal(good, {"drafter": 15}, flat)
    assert choice.source == "drafter" and choice.drafts == 15  # free verification: every extra draft is a gain
    cpu = VerificationCost([1.0, 1.1, 1.15, 1.17, 1.22, 1.25, 1.27, 1.29])  # a CPU-like cost of k drafts
    bad = {"drafter": _estimate(0.05, max_drafts=7)}
    with_drafter = ModelledCost(cpu, {"drafter": 0.1})
    assert best_proposal(bad, {"drafter": 7}, with_drafter) == best_proposal({}, {}, with_drafter)
    assert best_proposal(bad, {"drafter": 7}, ModelledCost(cpu)).source is None  # never worse than the target alone
    mid = {"drafter": _estimate(0.6, max_drafts=7), "lookup": _estimate(0.9, max_drafts=7)}
    with_drafter = ModelledCost(cpu, {"drafter": 0.12})
    choice = best_proposal(mid, {"drafter": 7, "lookup": 3}, with_drafter)
    assert choice.source == "lookup" and 1 <= choice.drafts <= 3
    assert best_proposal(mid, {"drafter": 7, "lookup": 0}, with_drafter).source == "drafter"


def test_the_choice_weighs_cost_at_the_calls_own_rate():
    steep = ModelledCost(VerificationCost([1.0 + 0.1 * k for k in range(11)]))  # each draft verified costs 0.1 steps
    lookup = {"lookup": _estimate(0.8, max_drafts=10)}

    def brute_force(rate):
        values = {k: lookup["lookup"].expected_tokens(k) - rate * steep("lookup", k) for k in range(1, 11)}
        return max(values, key=values.get)

    # Most tokens per unit of cost would be 6 drafts; against a plain step's rate (1 token per step) a draft is worth
    # its 0.1 steps while its chance 0.8^j exceeds 0.1: all 10; at a call's rate of 1.5, while 0.8^j > 0.15: 8.
    assert max(range(1, 11), key=lambda k: lookup["lookup"].expected_tokens(k) / steep("lookup", k)) == 6
    assert best_proposal(lookup, {"lookup": 10}, steep).drafts == brute_force(1.0) == 10
    assert best_proposal(lookup, {"lookup": 10}, steep, rate=1.5).drafts == brute_force(1.5) == 8
    # A drafter round that beats a plain step per unit of cost (1.3 tokens for 1.2 steps) but not the call's pace
    weak = {"draft": _estimate(0.3, max_drafts=3)}
    with_drafter = ModelledCost(VerificationCost([1.0, 1.1, 1.2, 1.3]), {"draft": 0.1})
    assert best_proposal(weak, {"draft": 3}, with_drafter, rate=1.0).source == "draft"
    assert best_proposal(weak, {"draft": 3}, with_drafter, rate=2.0).source is None
    # a rate below a plain step's is raised to it: a proposal is never taken at a loss against the target alone
    assert best_proposal(weak, {"draft": 3}, with_drafter, rate=0.5) == best_proposal(weak, {"draft": 3}, with_drafter)


def test_the_rate_is_the_recent_rounds_tokens_per_cost_and_never_below_a_plain_steps():
    from carryover_hf.round_policy import RateEstimate

    rate = RateEstimate(decay=1.0, prior_rounds=2.0)
    assert rate(0.5) == pytest.approx(2.0)  # no round yet: a plain step's, in the cost's own units
    for tokens, cost in [(4, 1.2), (1, 1.0), (3, 1.3)]:
        rate.observe(tokens, cost)
    assert rate(1.0) == pytest.approx((8 + 2) / (3.5 + 2))
    slow = RateEstimate(decay=0.5, prior_rounds=0.0)
    slow.observe(5, 1.0)
    slow.observe(1, 2.0)  # the latest round weighs twice the one before
    assert slow(1.0) == pytest.approx((5 * 0.5 + 1) / (1.0 * 0.5 + 2.0))
    slow.observe(1, 8.0)  # rounds that cost more than a plain step per token: the rate stays a plain step's
    assert slow(1.0) == 1.0


def test_cost_beyond_the_calibrated_range_grows_linearly():
    cost = VerificationCost([1.0, 1.2, 1.5])
    assert cost.verify(2) == 1.5 and cost.verify(4) == pytest.approx(2.1)


ANCHORS = [(None, 0), ("lookup", 1), ("lookup", 16), ("draft", 1), ("draft", 7)]


def _true_seconds(source, drafts):
    """A machine where a step takes 20 ms, each verified draft 3 ms, a drafter forward 8 ms and each drafted row 1 ms."""
    drafter = source == "draft"
    return 0.020 + 0.008 * drafter + 0.003 * drafts + 0.001 * drafter * drafts


def test_measured_costs_learn_the_machine_from_timed_rounds():
    prior = ModelledCost(VerificationCost([1.0 + 0.5 * k for k in range(17)]), {"draft": 1.0})  # far too pessimistic
    cost = MeasuredCost(prior, ANCHORS)
    assert cost("draft", 3) == prior("draft", 3)  # before any timed round: the prior, in its own units
    generator = torch.Generator().manual_seed(0)
    rounds = [(None, 0), ("draft", 3), ("lookup", 5), ("draft", 7), (None, 0), ("lookup", 2)] * 15
    for source, drafts in rounds:
        noise = 1.0 + 0.1 * (float(torch.rand((), generator=generator)) - 0.5)
        cost.record(source, drafts, _true_seconds(source, drafts) * noise)
    for source, drafts in [(None, 0), ("draft", 1), ("draft", 5), ("lookup", 10), ("lookup", 16)]:  # seen or not
        assert cost(source, drafts) == pytest.approx(_true_seconds(source, drafts), rel=0.1), (source, drafts)
    cost.record("draft", 3, 10.0)  # a stall counts as three times the prediction, not as ten seconds
    assert cost("draft", 3) < 1.5 * _true_seconds("draft", 3)


def test_measured_costs_keep_the_calibrated_shape_of_verification():
    # a CPU-like curve: nearly flat up to 11 drafts, then a step (a kernel tile); rounds only ever verify 0, 3 or 16
    curve = [1.0, 1.14, 1.22, 1.19, 1.19, 1.25, 1.26, 1.26, 1.32, 1.33, 1.38, 1.44, 1.71, 1.76, 1.78, 1.79, 1.84]

    def seconds(source, drafts):
        return 0.065 * curve[drafts] + 0.004 * (source == "draft")

    shaped = MeasuredCost(ModelledCost(VerificationCost([1.0 + 0.5 * (c - 1.0) for c in curve]), {"draft": 0.1}),
                          ANCHORS)  # the calibrated shape, at the wrong scale  # fmt: skip
    straight = MeasuredCost(ModelledCost(VerificationCost([1.0 + 0.05 * k for k in range(17)]), {"draft": 0.1}), ANCHORS)
    for source, drafts in [(None, 0), ("draft", 3), ("lookup", 16), ("draft", 3)] * 20:
        shaped.record(source, drafts, seconds(source, drafts))
        straight.record(source, drafts, seconds(source, drafts))
    for drafts in (5, 10, 12):
        assert shaped("lookup", drafts) == pytest.approx(seconds("lookup", drafts), rel=0.03)
    assert straight("lookup", 10) > 1.1 * seconds("lookup", 10)  # a line through k = 3 and 16 overprices k = 10


def test_measured_costs_follow_a_machine_that_slows_down():
    cost = MeasuredCost(ModelledCost(VerificationCost.flat(16), {"draft": 0.1}), ANCHORS, decay=0.9)
    for slowdown in (1.0, 2.0):  # the other core got busy: every round takes twice as long
        for source, drafts in [(None, 0), ("draft", 3), ("lookup", 4)] * 30:
            cost.record(source, drafts, slowdown * _true_seconds(source, drafts))
    assert cost(None, 0) == pytest.approx(2 * _true_seconds(None, 0), rel=0.05)


def test_calibration_is_measured_once_per_model_device_dtype_and_threads(tmp_path, monkeypatch):
    monkeypatch.setenv("CARRYOVER_HF_CACHE", str(tmp_path))
    target = tiny_target("llama", vocab_size=32)
    cost = calibrate(target, max_drafts=3, context_length=16, repeats=2)
    assert cost.relative[0] == 1.0 and len(cost.relative) == 4 and all(v > 0 for v in cost.relative)
    files = list((tmp_path / "verification-cost").glob("*.json"))
    assert len(files) == 1 and "float32" in files[0].name and "cpu" in files[0].name
    files[0].write_text('{"relative": [1.0, 9.0, 9.0, 9.0]}')  # a cached calibration is read back, not re-measured
    assert calibrate(target, max_drafts=3, context_length=16).relative == [1.0, 9.0, 9.0, 9.0]
    assert calibrate(target, max_drafts=3, context_length=16, repeats=1, cache=False).relative != [1.0, 9.0, 9.0, 9.0]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads != 1 else 2)
        calibrate(target, max_drafts=3, context_length=16, repeats=1)
    finally:
        torch.set_num_threads(threads)
    assert len(list((tmp_path / "verification-cost").glob("*.json"))) == 2  # another thread count, another entry


def test_calibration_gives_every_length_the_same_share_of_a_passing_load(monkeypatch):
    # A forward costs 1 + 0.1 x (new tokens) units on a clock of its own, twice that while another process holds the
    # core: here for the middle third of the calibration's forwards, long enough to cover several lengths' repeats
    # had they been timed back to back. Timed in interleaved passes, every length sees the load in about a third of
    # its samples and the median keeps the true curve.
    from carryover_hf import round_policy

    target = tiny_target("llama", vocab_size=32)
    max_drafts, repeats = 7, 8
    forwards = (repeats + 1) * (max_drafts + 1)
    clock, calls = [0.0], [0]

    def forward_costs(module, args, kwargs):
        tokens = (args[0] if args else kwargs["input_ids"]).shape[1]
        if tokens <= max_drafts + 1:  # the calibration's forwards, not the prefix
            loaded = forwards / 3 <= calls[0] < 2 * forwards / 3
            clock[0] += (1.0 + 0.1 * tokens) * (2.0 if loaded else 1.0)
            calls[0] += 1

    monkeypatch.setattr(round_policy.time, "perf_counter", lambda: clock[0])
    handle = target.register_forward_pre_hook(forward_costs, with_kwargs=True)
    try:
        curve = calibrate(target, max_drafts=max_drafts, context_length=16, repeats=repeats, cache=False)
    finally:
        handle.remove()
    assert calls[0] == forwards
    assert curve.relative == pytest.approx([(1.0 + 0.1 * (k + 1)) / 1.1 for k in range(max_drafts + 1)])


def _plan(policy, sequence, accepted):
    return policy.plan(torch.tensor([sequence]), first_draft_accepted=accepted > 0, accepted_drafts=accepted)


def test_the_cost_aware_policy_probes_a_failing_drafter_ever_more_rarely():
    from carryover_hf.round_policy import CostAwarePolicy

    cpu = VerificationCost([1.0, 1.1, 1.15, 1.17])
    policy = CostAwarePolicy(4, 1000, cpu, drafter_cost=0.1, decay=1.0, probe_after=2, max_probe_after=8)
    kinds, accepted = [], 0
    for step in range(60):
        plan = _plan(policy, list(range(step + 1)), accepted)
        if plan.kind == "draft":
            policy.drafted(plan.num_drafts)
        kinds.append(plan.kind)
        accepted = 0  # the drafter is always wrong
    assert kinds[0] == "draft"  # the prior says half of the drafts pass: worth a try
    drafts = [i for i, kind in enumerate(kinds) if kind == "draft"]
    gaps = [b - a for a, b in zip(drafts, drafts[1:])]
    assert gaps[-1] == 8 and gaps == sorted(gaps)  # probes at doubling intervals, capped
    assert kinds.count("plain") > 40


def test_the_cost_aware_policy_takes_full_blocks_when_verification_is_free_and_a_suffix_when_text_repeats():
    from carryover_hf.round_policy import CostAwarePolicy
    from carryover_hf.suffix_cache import SuffixCache

    policy = CostAwarePolicy(8, 1000, VerificationCost.flat(16), drafter_cost=0.0)
    plan = _plan(policy, [1, 2, 3], 0)
    assert plan.kind == "draft" and plan.num_drafts == 7
    policy.drafted(7)
    for _ in range(5):  # the drafter keeps failing: free verification still makes any chance worth a full block
        plan = _plan(policy, [1, 2, 3], 0)
        assert plan.kind == "draft" and plan.num_drafts == 7
        policy.drafted(7)

    repeated = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7]
    cpu = VerificationCost([1.0, 1.1, 1.15, 1.17, 1.22, 1.25, 1.27, 1.29, 1.3, 1.32, 1.35])
    policy = CostAwarePolicy(4, 1000, cpu, SuffixCache().session(repeated[:-1]), drafter_cost=0.1)
    policy.estimates["draft"].reached = [100.0] * 3  # a drafter seen to fail, a suffix seen to succeed
    from carryover_hf.round_policy import AcceptanceEstimate, suffix_estimate_key

    seen = AcceptanceEstimate(16, accepted=[90.0] * 16, reached=[100.0] * 16)
    policy.estimates[suffix_estimate_key(3)] = seen  # [5, 6, 7] matched: 3 tokens
    plan = _plan(policy, repeated, 0)
    assert plan.kind == "lookup" and plan.drafts.tolist()[:3] == [8, 9, 10]
