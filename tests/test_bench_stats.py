"""Benchmark statistics on synthetic data with known answers."""

import numpy as np
import pytest

from carryover_hf.tools.bench import stats


def test_micro_and_per_prompt_acceptance_differ_as_defined():
    # Prompt A: four rounds of 1 token; prompt B: one round of 5 tokens.
    lengths = [[1, 1, 1, 1], [5]]
    assert stats.micro_mean_acceptance(lengths) == pytest.approx(9 / 5)  # pooled over rounds (vLLM)
    assert stats.per_prompt_mean_acceptance(lengths) == pytest.approx(3.0)  # mean of prompt means (DFlash)
    assert stats.per_prompt_mean_acceptance([[2, 4], []]) == pytest.approx(3.0)  # prompts without rounds skipped
    assert stats.micro_mean_acceptance([[], []]) is None


def test_position_acceptance_rates_count_only_proposed_positions():
    # Round 1: 3 drafts, 2 accepted. Round 2: 3 drafts, 0 accepted. Round 3: 1 draft (budget), 1 accepted.
    rates = stats.position_acceptance_rates([[3, 1, 2]], [[3, 3, 1]])
    assert rates.proposed == [3, 2, 2]
    assert rates.accepted == [2, 1, 0]
    assert rates.rates == pytest.approx([2 / 3, 1 / 2, 0.0])
    assert stats.position_acceptance_rates([[1]], [[0]]).rates == []
    with pytest.raises(ValueError, match="accepted 3 drafts but only 2"):
        stats.position_acceptance_rates([[4]], [[2]])


def test_bootstrap_of_a_constant_is_the_constant():
    interval = stats.bootstrap_interval([np.full(12, 3.25)], stats.mean, n_resamples=500)
    assert (interval.estimate, interval.low, interval.high) == (3.25, 3.25, 3.25)
    assert interval.n == 12


def test_bootstrap_degenerate_sizes():
    assert stats.bootstrap_interval([[]], stats.mean).estimate is None
    single = stats.bootstrap_interval([[2.0]], stats.mean)
    assert single.estimate == 2.0 and single.low is None and single.high is None
    with pytest.raises(ValueError, match="equal lengths"):
        stats.bootstrap_interval([[1.0, 2.0], [1.0]], stats.mean_difference)


def test_bootstrap_interval_covers_a_known_normal_mean():
    """Over many samples of N(3, 1), the 95% interval of the mean should contain 3 about 95% of the time."""
    rng = np.random.default_rng(1234)
    trials, hits = 200, 0
    for trial in range(trials):
        sample = rng.normal(3.0, 1.0, size=40)
        interval = stats.bootstrap_interval([sample], stats.mean, n_resamples=999, seed=trial)
        assert interval.low < sample.mean() < interval.high
        hits += interval.contains(3.0)
    assert 0.88 <= hits / trials <= 0.99  # binomial sd at 200 trials is 1.5 %; BCa is slightly liberal at n = 40


def test_ratio_of_sums_pools_rather_than_averaging_ratios():
    tokens = np.array([10.0, 30.0])
    seconds = np.array([1.0, 2.0])
    interval = stats.bootstrap_interval([tokens, seconds], stats.ratio_of_sums, n_resamples=500)
    assert interval.estimate == pytest.approx(40 / 3)  # not the mean of 10 and 15
    assert 10.0 <= interval.low <= interval.estimate <= interval.high <= 15.0


def test_speedup_of_a_method_twice_as_fast_on_every_prompt_is_exactly_two():
    rng = np.random.default_rng(0)
    tokens = rng.integers(20, 200, size=30).astype(float)
    baseline_seconds = tokens / rng.uniform(20, 80, size=30)  # throughput varies a lot between prompts
    interval = stats.bootstrap_interval(
        [tokens, baseline_seconds / 2, tokens, baseline_seconds], stats.ratio_of_rates, n_resamples=500
    )
    assert interval.estimate == pytest.approx(2.0)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)


def test_paired_interval_sees_a_consistent_gain_that_prompt_variance_hides():
    rng = np.random.default_rng(7)
    base = rng.normal(4.0, 2.0, size=50)  # prompts differ a lot
    better = base + 0.3 + rng.normal(0.0, 0.05, size=50)  # but B beats A by 0.3 on every prompt
    paired = stats.bootstrap_interval([better, base], stats.mean_difference, n_resamples=2000)
    assert paired.estimate == pytest.approx(np.mean(better - base))
    assert 0 < paired.low < 0.3 < paired.high < 0.6
    reverse = stats.bootstrap_interval([base, better], stats.mean_difference, n_resamples=2000)
    assert reverse.high < 0  # the sign follows the order A minus B
    # Unpaired intervals of the two means overlap widely: the difference is invisible without pairing.
    a = stats.bootstrap_interval([base], stats.mean, n_resamples=2000)
    b = stats.bootstrap_interval([better], stats.mean, n_resamples=2000)
    assert b.low < a.high


def test_relative_gain_of_rates():
    acc_a, rounds_a = np.array([6.0, 12.0]), np.array([2.0, 4.0])  # tau 3
    acc_b, rounds_b = np.array([5.0, 10.0]), np.array([2.0, 4.0])  # tau 2.5
    gain = stats.bootstrap_interval([acc_a, rounds_a, acc_b, rounds_b], stats.relative_difference_of_rates, n_resamples=200)
    assert gain.estimate == pytest.approx(0.2)
    difference = stats.bootstrap_interval([acc_a, rounds_a, acc_b, rounds_b], stats.difference_of_rates, n_resamples=200)
    assert difference.estimate == pytest.approx(0.5)
    assert difference.low == pytest.approx(0.5) and difference.high == pytest.approx(0.5)


def test_interval_ends_at_the_estimate_do_not_leave_it_out_by_rounding():
    # Two prompts: scipy's BCa upper end comes out one rounding step below the point estimate for this speedup.
    data = [[99.0, 67.0], [9.8, 13.4], [67.0, 123.0], [5.7, 18.1]]
    interval = stats.bootstrap_interval(data, stats.ratio_of_rates, n_resamples=999)
    assert interval.low <= interval.estimate <= interval.high
    assert interval.estimate == pytest.approx(0.89627949, abs=1e-8) and interval.high == interval.estimate
