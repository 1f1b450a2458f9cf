"""Statistics of a benchmark: acceptance lengths, per-position acceptance rates, bootstrap confidence intervals.

Every interval is a bootstrap over prompts (the unit that is sampled from a suite), computed with
`scipy.stats.bootstrap`. Statistics that compare two methods resample the *same* prompts for both (a paired
bootstrap), so prompt-to-prompt variation, which is large, cancels out of the difference.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DEFAULT_RESAMPLES = 9999
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class Interval:
    """A point estimate and its bootstrap confidence interval (`low`/`high` are `None` with fewer than 2 prompts)."""

    estimate: float | None
    low: float | None = None
    high: float | None = None
    method: str | None = None  # "BCa" or "percentile": which bootstrap interval was used
    n: int = 0  # number of prompts the interval is over

    def to_dict(self) -> dict:
        return {"estimate": self.estimate, "ci_low": self.low, "ci_high": self.high, "ci_method": self.method, "n": self.n}

    def contains(self, value: float) -> bool:
        return self.low is not None and self.high is not None and self.low <= value <= self.high


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def bootstrap_interval(
    data: Sequence[Sequence[float]],
    statistic: Callable[..., np.ndarray],
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
) -> Interval:
    """Paired bootstrap interval of `statistic(*data, axis=-1)` over the common first axis of `data` (prompts).

    All arrays in `data` hold one value per prompt, aligned; resampling draws the same prompts from each. The BCa
    interval is used, falling back to the percentile interval where BCa is undefined (e.g. a constant sample, where
    both ends equal the constant) or leaves out the point estimate (which happens with two or three prompts).
    """
    from scipy.stats import bootstrap

    arrays = [np.asarray(a, dtype=np.float64) for a in data]
    n = len(arrays[0])
    if any(len(a) != n for a in arrays):
        raise ValueError(f"paired samples must have equal lengths, got {[len(a) for a in arrays]}")
    if n == 0:
        return Interval(None, n=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        estimate = _finite(statistic(*arrays, axis=-1))
    if n < 2:
        return Interval(estimate, n=n)
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings(), np.errstate(divide="ignore", invalid="ignore"):
            warnings.simplefilter("ignore")  # BCa warns on degenerate samples; the fallback below handles them
            result = bootstrap(
                arrays,
                statistic,
                n_resamples=n_resamples,
                confidence_level=confidence,
                paired=True,
                vectorized=True,
                method=method,
                rng=np.random.default_rng(seed),
            )
        low, high = _finite(result.confidence_interval.low), _finite(result.confidence_interval.high)
        if low is None or high is None:
            continue
        if estimate is None:
            return Interval(estimate, low, high, method, n)
        slack = 1e-9 * max(abs(estimate), 1.0)  # an end that differs from the estimate by rounding only
        if low - slack <= estimate <= high + slack:
            return Interval(estimate, min(low, estimate), max(high, estimate), method, n)
        if method == "percentile":
            return Interval(estimate, low, high, method, n)
        # BCa can put a very small sample's interval beside the point estimate (two prompts of a category, say):
        # the percentile interval is used then.
    return Interval(estimate, n=n)


# -- vectorised statistics (accept `axis`, as scipy's bootstrap passes resamples along a leading axis) ----------------
def mean(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(x, axis=axis)


def ratio_of_sums(numerator: np.ndarray, denominator: np.ndarray, axis: int = -1) -> np.ndarray:
    """`sum(numerator) / sum(denominator)`: a pooled rate, e.g. tokens per round over all rounds of all prompts."""
    return np.sum(numerator, axis=axis) / np.sum(denominator, axis=axis)


def ratio_of_rates(num_a, den_a, num_b, den_b, axis: int = -1) -> np.ndarray:
    """`(sum num_a / sum den_a) / (sum num_b / sum den_b)`: e.g. the speedup of a's throughput over b's."""
    return ratio_of_sums(num_a, den_a, axis=axis) / ratio_of_sums(num_b, den_b, axis=axis)


def difference_of_rates(num_a, den_a, num_b, den_b, axis: int = -1) -> np.ndarray:
    return ratio_of_sums(num_a, den_a, axis=axis) - ratio_of_sums(num_b, den_b, axis=axis)


def mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a - b, axis=axis)


def relative_difference_of_rates(num_a, den_a, num_b, den_b, axis: int = -1) -> np.ndarray:
    """`rate_a / rate_b - 1`: e.g. the relative gain in acceptance length of a over b."""
    return ratio_of_rates(num_a, den_a, num_b, den_b, axis=axis) - 1


# -- acceptance length ---------------------------------------------------------------------------------------------
def micro_mean_acceptance(acceptance_lengths: Sequence[Sequence[int]]) -> float | None:
    """Mean acceptance length over all rounds of all prompts (vLLM's `1 + accepted / drafts`)."""
    total = sum(sum(a) for a in acceptance_lengths)
    rounds = sum(len(a) for a in acceptance_lengths)
    return total / rounds if rounds else None


def per_prompt_mean_acceptance(acceptance_lengths: Sequence[Sequence[int]]) -> float | None:
    """Mean over prompts of each prompt's mean acceptance length (as DFlash reports tau); empty prompts skipped."""
    means = [sum(a) / len(a) for a in acceptance_lengths if len(a)]
    return sum(means) / len(means) if means else None


@dataclass(frozen=True)
class PositionRates:
    """Per draft position j = 1..K: drafts accepted at j / rounds that proposed a draft at j."""

    accepted: list[int]
    proposed: list[int]

    @property
    def rates(self) -> list[float | None]:
        return [a / p if p else None for a, p in zip(self.accepted, self.proposed)]

    def to_dict(self) -> dict:
        return {"rates": self.rates, "accepted": self.accepted, "proposed": self.proposed}


def position_acceptance_rates(
    acceptance_lengths: Sequence[Sequence[int]], draft_lengths: Sequence[Sequence[int]]
) -> PositionRates:
    """Acceptance rate at each draft position, from per-round acceptance lengths (bonus included) and draft lengths.

    A round that proposed `d` drafts and accepted `m = acceptance_length - 1` of them counts as proposed at positions
    1..d and accepted at 1..m. Rates are conditional on the position having been proposed, so rounds cut short by the
    length budget do not count as rejections.
    """
    pairs = [(a, d) for acc, drafts in zip(acceptance_lengths, draft_lengths, strict=True) for a, d in zip(acc, drafts, strict=True)]
    width = max((d for _, d in pairs), default=0)
    accepted, proposed = [0] * width, [0] * width
    for length, drafts in pairs:
        if length - 1 > drafts:
            raise ValueError(f"a round accepted {length - 1} drafts but only {drafts} were proposed")
        for j in range(drafts):
            proposed[j] += 1
            accepted[j] += j < length - 1
    return PositionRates(accepted, proposed)


__all__ = [
    "Interval",
    "PositionRates",
    "bootstrap_interval",
    "difference_of_rates",
    "mean",
    "mean_difference",
    "micro_mean_acceptance",
    "per_prompt_mean_acceptance",
    "position_acceptance_rates",
    "ratio_of_rates",
    "ratio_of_sums",
    "relative_difference_of_rates",
]
