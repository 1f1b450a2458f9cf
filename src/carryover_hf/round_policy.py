"""Cost-aware choice of a round's proposal: which source and how many drafts, from past rounds only.

A round verifies `k` drafts in one target forward over `k + 1` tokens and returns `1 + (accepted drafts)` tokens.
With `a_j` the chance that draft j is accepted given that drafts 1..j-1 were, the expected tokens of a round are
`1 + sum_{j<=k} prod_{i<=j} a_i`, and its cost, in 1-token target steps, is `verify(k) + proposal`. The policy takes,
per source (a drafter, a context lookup, a suffix cache: whatever offers drafts this round), the `k` that maximises
`expected tokens - rate * cost`, and the best source, where `rate` is the tokens per unit of cost the call has made
so far: the time a round saves is the tokens it adds times the time a token takes on average (`1 / rate`), so a round
is worth its extra cost only where its extra tokens come faster than that. A long lookup in repeating text is taken
whole even where a shorter one would score more tokens per unit of cost, and a drafter round must beat the call's own
pace, not just a plain step's. A plain step (k = 0, cost 1, one token) is always a candidate, and a proposal beats it
only at more tokens per unit of cost than the rate, which is never below a plain step's: a round is never expected
to be worse than the target alone.

* Costs, in any unit as long as one: `ModelledCost` (a `VerificationCost` curve, `verify(k)` relative to a 1-token
  step, plus a fixed cost per proposal source), given (`VerificationCost.flat()`: every forward costs one step, as on
  a GPU where a block is nearly free, or a list), calibrated once on the target's own device, dtype and thread count
  (`calibrate`, cached on disk per (model, device, dtype, threads)); or `MeasuredCost`, seconds per round learnt
  online from the call's own rounds (what the round cost on this machine under its current load, CPU kernels and
  all), starting from a `ModelledCost` prior.
* `AcceptanceEstimate`: per source, the conditional acceptance of each draft position, a Beta prior updated by each
  verified round (`observe(drafted, accepted)`); it reads only rounds already verified, which is what keeps the
  choice lossless: it never looks at the target's output for the round being chosen. Round timings are past rounds
  too: a measured cost changes which lossless proposal is made, never what is accepted.
* `best_proposal`: the choice; `RateEstimate`: the call's tokens per unit of cost so far.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers.utils import logging

from .compatibility import CACHE_ARGUMENT

logger = logging.get_logger(__name__)


@dataclass
class VerificationCost:
    """Relative cost of verifying k drafts: `relative[k]` = time(forward over k + 1 tokens) / time(1-token step)."""

    relative: list[float]  # index k = 0..max_drafts; relative[0] == 1.0

    @classmethod
    def flat(cls, max_drafts: int) -> "VerificationCost":
        return cls([1.0] * (max_drafts + 1))

    def verify(self, k: int) -> float:
        if k < len(self.relative):
            return self.relative[k]
        # beyond the calibrated range: linear in the extra tokens from the last two points
        last, before = self.relative[-1], self.relative[-2] if len(self.relative) > 1 else self.relative[-1]
        return last + (k - len(self.relative) + 1) * max(last - before, 0.0)


@dataclass
class AcceptanceEstimate:
    """Conditional acceptance per draft position for one source, with a Beta(prior_accept, prior_reject) prior."""

    max_drafts: int
    prior_accept: float = 1.0
    prior_reject: float = 1.0
    decay: float = 1.0  # each round's counts weigh `decay` times the previous round's (1.0: no forgetting)
    accepted: list[float] = field(default_factory=list)
    reached: list[float] = field(default_factory=list)
    # An estimate this one's rates shrink towards, position by position, instead of the Beta prior's chain: a suffix
    # match of 4 tokens starts from what 3-token matches have shown, not from 1/2 (a longer match is no less reliable).
    parent: "AcceptanceEstimate | None" = None

    def __post_init__(self):
        self.accepted = self.accepted or [0.0] * self.max_drafts
        self.reached = self.reached or [0.0] * self.max_drafts

    def observe(self, drafted: int, accepted: int) -> None:
        """A verified round: `drafted` drafts offered, the first `accepted` of them accepted."""
        if self.decay != 1.0:
            self.accepted = [a * self.decay for a in self.accepted]
            self.reached = [r * self.decay for r in self.reached]
        for j in range(min(drafted, accepted + 1, self.max_drafts)):  # positions the target judged
            self.reached[j] += 1
            self.accepted[j] += float(j < accepted)

    def forget(self, factor: float) -> None:
        """Counts weigh `factor` less (towards the prior): evidence ages whether or not the source is used."""
        self.accepted = [a * factor for a in self.accepted]
        self.reached = [r * factor for r in self.reached]

    def conditional(self) -> list[float]:
        """Each position's rate shrinks (with the prior's strength) towards the parent's rate at that position, or
        without a parent: position 1 towards the Beta prior's mean and each later one towards the rate before it
        rather than towards the mean (positions rarely reached would otherwise stay near 1/2 and make long proposals
        look better than the evidence says)."""
        strength = self.prior_accept + self.prior_reject
        parent = self.parent.conditional() if self.parent is not None else None
        rates, previous = [], self.prior_accept / strength if strength else 0.0
        for j, (a, r) in enumerate(zip(self.accepted, self.reached)):
            if parent is not None:
                previous = parent[min(j, len(parent) - 1)]
            previous = (a + strength * previous) / (r + strength) if r + strength > 0 else previous
            rates.append(previous)
        return rates

    def expected_tokens(self, k: int) -> float:
        """1 + expected accepted drafts when k are offered."""
        return self.expected_tokens_up_to(k)[k]

    def expected_tokens_up_to(self, k: int) -> list[float]:
        """`expected_tokens(j)` for j = 0..k, from one pass over the rates."""
        totals, survive = [1.0], 1.0
        for rate in self.conditional()[:k]:
            survive *= rate
            totals.append(totals[-1] + survive)
        return totals + [totals[-1]] * (k + 1 - len(totals))  # past max_drafts: nothing more


@dataclass
class ModelledCost:
    """The cost of a round from a model, in 1-token target steps: verifying its `k` drafts (`verification.verify(k)`)
    plus producing them (`proposal[source]`: a drafter forward; a lookup is about free). A plain step costs 1."""

    verification: VerificationCost
    proposal: Mapping[str, float] = field(default_factory=dict)

    def __call__(self, source: str | None, drafts: int) -> float:
        return self.verification.verify(drafts) + (self.proposal.get(source, 0.0) if source is not None else 0.0)


class MeasuredCost:
    """The seconds a round takes, learnt from the rounds' own timings (`record`), starting from a `ModelledCost` prior.

    A round (a proposal of k drafts, or a plain step with k = 0) is modelled as `c0 + c1 * drafter + c2 * v(k) + c3 *
    drafter * k` seconds: a step, a drafter forward, the verification of k drafts, each drafted row (`drafter` is 1
    when the drafter proposed), where `v(k) = prior.verification.verify(k) - 1` is the prior's shape of verification
    cost in k (k itself where the prior is flat and has no shape): the fit scales it to this machine's seconds. A calibrated prior (`calibrate`) gives the target's real
    shape (on a CPU nearly flat up to a tile size, then a step: 1.38 steps for 10 drafts, 1.71 for 12 on SmolLM2-135M);
    a straight line would price mid-length proposals by the mean slope and make them look dearer than they are. The coefficients are a weighted least-squares fit of the rounds timed so far, recent rounds
    weighing more (`decay` per round), pulled towards the prior by pseudo-rounds at the prior's costs (in seconds from
    the first timed round on) that weigh `prior_rounds / (1 + timed rounds)`: they settle what the first rounds cannot
    tell (a k never tried) and fade as the rounds tell more. A round slower than `outlier` times the prediction (a page fault, the
    other process on the core) counts as that much. Unseen (source, k) pairs are predicted by the same four numbers."""

    def __init__(self, prior: ModelledCost, anchors: list[tuple[str | None, int]], *, prior_rounds: float = 2.0,
                 decay: float = 0.98, outlier: float = 3.0):  # fmt: skip
        self.prior, self.anchors = prior, anchors
        curve = prior.verification
        self.shape = curve.verify if curve.verify(len(curve.relative) - 1) > curve.verify(0) else None
        self.prior_rounds, self.decay, self.outlier = prior_rounds, decay, outlier
        self.gram = [[0.0] * 4 for _ in range(4)]  # decayed sum of w x x^T over timed rounds, then the prior's
        self.moment = [0.0] * 4  # decayed sum of w x y
        self.prior_gram: list[list[float]] | None = None  # the prior's pseudo-rounds, in seconds (after round 1)
        self.prior_moment: list[float] | None = None
        self.weight = 0.0  # decayed number of timed rounds
        self.rounds = 0  # timed rounds
        self.timed: dict[str | None, int] = {}  # timed rounds per source (None: plain steps)
        self.coefficients: list[float] | None = None  # None: no timed round yet (the prior's units apply)

    def _features(self, source: str | None, drafts: int) -> list[float]:
        drafter = float(source == "draft")
        verification = self.shape(drafts) - 1.0 if self.shape is not None else float(drafts)
        return [1.0, drafter, verification, drafter * drafts]

    def record(self, source: str | None, drafts: int, seconds: float) -> None:
        """A round just verified: `drafts` from `source` (None: a plain step) took `seconds`, proposal included."""
        if not seconds > 0:
            return
        if self.prior_gram is None:  # the first timed round sets the prior's scale: seconds per 1-token step
            unit = seconds / self.prior(source, drafts)
            self.prior_gram, self.prior_moment = [[0.0] * 4 for _ in range(4)], [0.0] * 4
            for anchor in self.anchors:
                _accumulate(self.prior_gram, self.prior_moment, self._features(*anchor),
                            unit * self.prior(*anchor), self.prior_rounds / len(self.anchors))  # fmt: skip
        elif self.weight >= 5:
            seconds = min(seconds, self.outlier * self(source, drafts))
        for row in self.gram:
            row[:] = [value * self.decay for value in row]
        self.moment = [value * self.decay for value in self.moment]
        self.weight = self.weight * self.decay + 1.0
        self.rounds += 1
        self.timed[source] = self.timed.get(source, 0) + 1
        _accumulate(self.gram, self.moment, self._features(source, drafts), seconds, 1.0)
        fade = max(1.0 / (1 + self.rounds), 1e-3)
        gram = [[a + fade * b for a, b in zip(row, prior)] for row, prior in zip(self.gram, self.prior_gram)]
        self.coefficients = _solve(gram, [a + fade * b for a, b in zip(self.moment, self.prior_moment)])

    def __call__(self, source: str | None, drafts: int) -> float:
        if self.coefficients is None:
            return self.prior(source, drafts)
        step = max(self.coefficients[0], 1e-9)
        value = sum(c * x for c, x in zip(self.coefficients, self._features(source, drafts)))
        return max(value, 0.05 * step)  # a fit never makes a round nearly free


def _accumulate(gram: list[list[float]], moment: list[float], x: list[float], y: float, weight: float) -> None:
    for i, xi in enumerate(x):
        moment[i] += weight * xi * y
        for j, xj in enumerate(x):
            gram[i][j] += weight * xi * xj


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting on a small system (a round's worth of microseconds)."""
    n = len(rhs)
    rows = [list(row) + [value] for row, value in zip(matrix, rhs)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        if abs(rows[col][col]) < 1e-18:
            continue
        for r in range(n):
            if r != col:
                factor = rows[r][col] / rows[col][col]
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col])]
    return [row[n] / row[i] if abs(row[i]) >= 1e-18 else 0.0 for i, row in enumerate(rows)]


@dataclass(frozen=True)
class Choice:
    source: str | None  # None: a plain target step
    drafts: int
    value: float  # expected tokens - rate * cost


@dataclass
class RateEstimate:
    """The tokens per unit of cost of a call's verified rounds, recent rounds weighing more (`decay` per round),
    starting from `prior_rounds` plain steps (one token at the cost of a plain step)."""

    decay: float = 0.98
    prior_rounds: float = 2.0
    tokens: float = 0.0
    cost: float = 0.0

    def observe(self, tokens: int, cost: float) -> None:
        self.tokens = self.tokens * self.decay + tokens
        self.cost = self.cost * self.decay + cost

    def __call__(self, plain_step_cost: float) -> float:
        """Tokens per unit of cost, never below a plain step's (`1 / plain_step_cost`, in the same units)."""
        rate = (self.tokens + self.prior_rounds) / (self.cost + self.prior_rounds * plain_step_cost)
        return max(rate, 1.0 / plain_step_cost)


def best_proposal(
    estimates: Mapping[str, AcceptanceEstimate],
    available: Mapping[str, int],
    cost,
    drafts_only: bool = False,
    rate: float | None = None,
) -> Choice:
    """The source and draft count with the most `expected tokens - rate * cost(source, drafts)` (`cost` a
    `ModelledCost` or `MeasuredCost`; `rate` in tokens per unit of that cost, by default a plain step's, and never
    below it). A plain step, `cost(None, 0)`, returns one token; with `drafts_only` it is no candidate, and the best
    proposal is returned even if it scores below a plain step.

    `available[source]` is how many drafts the source can offer this round (0 or absent: none)."""
    plain = cost(None, 0)
    rate = max(rate or 0.0, 1.0 / plain)
    best = Choice(None, 0, float("-inf") if drafts_only else 1.0 - rate * plain)
    for source, offered in available.items():
        if offered <= 0 or source not in estimates:
            continue
        expected = estimates[source].expected_tokens_up_to(offered)
        for k in range(1, offered + 1):
            value = expected[k] - rate * cost(source, k)
            if value > best.value + 1e-12 * abs(rate * plain):  # ties go to fewer drafts
                best = Choice(source, k, value)
    return best


SUFFIX_MATCH_BUCKETS = (1, 2, 3, 4, 8)  # matched lengths 1, 2, 3, 4-7 and 8 or more: one estimate each
# A longer match's estimate starts from the next shorter one's (a match of 4 tokens is no less reliable than one of 3)
SHORTER_MATCH = {f"lookup{b}": f"lookup{a}" for a, b in zip(SUFFIX_MATCH_BUCKETS, SUFFIX_MATCH_BUCKETS[1:])}


def suffix_estimate_key(match_length: int) -> str:
    """The acceptance estimate a suffix match is scored against: one per bucket of `SUFFIX_MATCH_BUCKETS`."""
    return f"lookup{max(b for b in SUFFIX_MATCH_BUCKETS if b <= max(match_length, 1))}"


class AcceptanceMemory:
    """What the rounds of a target and drafter have shown across `generate` calls, per estimate key ("draft", a suffix
    match bucket): an empirical-Bayes prior. A call's estimate of a source starts from the memory's (its `parent`, at
    the Beta prior's strength) instead of from 1/2, so the first rounds of a short call already propose what earlier
    calls found worth proposing, and the call's own rounds take over as they come (after 5 rounds at a position the
    memory weighs 2/7). The memory observes every verified round of every call and weighs each round `decay` times the
    one after it (about the last 1 / (1 - decay) rounds of a source count), so it follows a workload that changes; a
    longer suffix match's estimate starts from the next shorter one's (`SHORTER_MATCH`). Without earlier calls it is
    the call's own rounds pooled, which is what a fresh memory per call gives."""

    def __init__(self, decay: float = 0.99):
        self.decay = decay
        self.estimates: dict[str, AcceptanceEstimate] = {}

    def estimate(self, key: str, max_drafts: int) -> AcceptanceEstimate:
        if key not in self.estimates:
            parent = self.estimate(SHORTER_MATCH[key], max_drafts) if key in SHORTER_MATCH else None
            self.estimates[key] = AcceptanceEstimate(max_drafts, decay=self.decay, parent=parent)
        return self.estimates[key]


# Where `generation.cost_aware_policy` keeps what the policy learns across calls: a dict in the drafter's `__dict__`
# (runtime state, never saved), read and written whole through `CarryoverDrafterModel.round_policy_state` and
# `restore_round_policy_state`.
ROUND_POLICY_STATE_ATTRIBUTE = "_round_policy_memory"


class RoundPolicyState:
    """A copy of what the cost-aware round policy keeps on a drafter across `generate` calls: the `AcceptanceMemory`
    per target and temperature and the `MeasuredCost` per target, device, dtype and thread count (runtime state of
    this process, never saved with the model). Take one with `drafter.round_policy_state()` and put it back, as often
    as wanted, with `drafter.restore_round_policy_state(state)`: both copy, so calls after a restore never change the
    snapshot, and every restore starts from the same state. An empty one (`RoundPolicyState()`) is a drafter that
    has learnt nothing yet (`drafter.reset_round_policy_state()`). Opaque: `len` is how many memories and costs it
    holds."""

    def __init__(self, learnt: Mapping | None = None):
        self._learnt = copy.deepcopy(dict(learnt or {}))

    def __len__(self) -> int:
        return len(self._learnt)

    def __repr__(self) -> str:
        kinds = [key[0] if isinstance(key, tuple) and key else key for key in self._learnt]
        return f"RoundPolicyState({', '.join(f'{kinds.count(k)} {k}' for k in dict.fromkeys(kinds)) or 'empty'})"

    def copy_learnt(self) -> dict:
        """A fresh copy of the state, in the form the drafter keeps it (for `restore_round_policy_state`)."""
        return copy.deepcopy(self._learnt)


class CostAwarePolicy:
    """A round policy with `ProposalPolicy`'s interface (`plan`, `drafted`, `confidence`, `lookup_drafts`) that picks
    the source and draft count by `best_proposal`, against the call's own rate so far (`RateEstimate`): the drafter (up to block size - 1 drafts, at `drafter_cost` steps a
    proposal) or a suffix match (`SuffixSession`: the live sequence and, with a shared `SuffixCache`, earlier calls;
    drafts with one-hot distributions under sampling, as a context lookup), else a plain step. With `measured=True`
    the costs are `MeasuredCost`, learnt from the time between one `plan` and the next (the round's proposal, its
    verification and Transformers' bookkeeping), with `cost` and `drafter_cost` as the prior.

    A pessimistic estimate would never be corrected if no source were tried again, so after `probe_after` plain rounds
    in a row the best proposal there is is tried once (the interval doubles after a probe whose first draft fails, up
    to `max_probe_after`, and resets when one succeeds). Every decision reads only verified rounds (lossless)."""

    def __init__(
        self,
        block_size: int,
        max_length: int,
        cost: VerificationCost,
        suffix_session=None,
        *,
        drafter_cost: float = 0.1,
        measured: bool | MeasuredCost = False,
        memory: AcceptanceMemory | None = None,
        max_suffix_drafts: int = 16,
        decay: float = 0.98,
        probe_after: int = 2,
        max_probe_after: int = 32,
    ):
        self.block_size, self.max_length, self.max_suffix_drafts = block_size, max_length, max_suffix_drafts
        self.suffix = suffix_session
        self.cost = ModelledCost(cost, {"draft": drafter_cost})
        if isinstance(measured, MeasuredCost):  # what earlier calls on this machine measured, learning on
            self.cost = measured
        elif measured:
            anchors = [(None, 0), ("lookup", 1), ("lookup", max_suffix_drafts), ("draft", 1), ("draft", block_size - 1)]
            self.cost = MeasuredCost(self.cost, anchors)
        self.confidence = None  # no confidence cut: the length is chosen here
        self.lookup_drafts = max_suffix_drafts if suffix_session is not None else None
        # Acceptance per source; a suffix match's by the length that matched (`suffix_estimate_key`): a long match in
        # repeating text is accepted far more often than a 2-token one, and one pooled estimate would hide that. Each
        # starts from the memory's estimate of its key (earlier calls' rounds, or a fresh memory: this call's pooled).
        self.memory = memory if memory is not None else AcceptanceMemory()
        self.estimates: dict[str, AcceptanceEstimate] = {}
        self._estimate("draft")
        self.decay = decay
        self.rate = RateEstimate(decay)
        self.probe_after, self.max_probe_after = probe_after, max_probe_after
        self.interval = probe_after
        self.plain_streak = 0
        self.last: tuple[str | None, int] | None = None  # (source, drafts) of the round just verified
        self.last_estimate: str | None = None  # the key of the estimate that round is scored against
        self.started: float | None = None  # when the round just verified was planned (measured costs)
        self.probing = False
        self.choices: list[Choice] = []  # one per planned round (statistics; the benchmark reads them)

    def plan(self, input_ids: torch.LongTensor, first_draft_accepted: bool, accepted_drafts: int | None = None):
        from .generation import RoundPlan

        now = time.perf_counter()
        if accepted_drafts is None:
            accepted_drafts = int(first_draft_accepted)  # a lower bound when only the first draft's fate is known
        if self.last is not None:
            source, drafted = self.last
            if isinstance(self.cost, MeasuredCost) and self.started is not None:
                self.cost.record(source, drafted, now - self.started)
            self.rate.observe(1 + (accepted_drafts if source is not None else 0), self.cost(source, drafted))
            if source is not None:
                self.estimates[self.last_estimate].observe(drafted, accepted_drafts)
                self.memory.estimate(self.last_estimate, self.estimates[self.last_estimate].max_drafts).observe(
                    drafted, accepted_drafts)  # fmt: skip
                if self.probing:
                    self.interval = (self.probe_after if accepted_drafts > 0
                                     else min(2 * self.interval, self.max_probe_after))  # fmt: skip
        for estimate in self.estimates.values():  # every source's evidence ages, so an idle one is tried again
            estimate.forget(self.decay)
        self.last, self.probing, self.started = None, False, now
        room = self.max_length - input_ids.shape[1] - 1
        if room <= 0:
            return RoundPlan("end")
        available = {"draft": min(self.block_size - 1, room)}
        estimates = {"draft": self.estimates["draft"]}
        keys = {"draft": "draft"}
        suffix_drafts = None
        if self.suffix is not None:
            new = input_ids[0, len(self.suffix.tokens) :].tolist()
            self.suffix.extend(new)
            proposal = self.suffix.propose(min(self.max_suffix_drafts, room))
            if proposal is not None:
                suffix_drafts = proposal.tokens
                available["lookup"] = len(suffix_drafts)
                keys["lookup"] = suffix_estimate_key(proposal.match_length)
                estimates["lookup"] = self._estimate(keys["lookup"])
        rate = self.rate(self.cost(None, 0))
        choice = best_proposal(estimates, available, self.cost, rate=rate)
        if choice.source is None and self.plain_streak + 1 >= self.interval:  # a probe: the best proposal there is
            choice, self.probing = best_proposal(estimates, available, self.cost, drafts_only=True, rate=rate), True
        elif choice.source is not None and self.choices and isinstance(self.cost, MeasuredCost) and not self.cost.timed.get(None):
            # The plain step is what every proposal is weighed against: time one (the second round) rather than
            # trust the prior's guess of it, which no later round would correct while proposals keep winning.
            choice = Choice(None, 0, 1.0 - rate * self.cost(None, 0))
        self.choices.append(choice)
        self.last = (choice.source, choice.drafts)
        self.last_estimate = keys.get(choice.source)
        if choice.source is None:
            self.plain_streak += 1
            return RoundPlan("plain")
        self.plain_streak = 0
        if choice.source == "lookup":
            drafts = torch.tensor(suffix_drafts[: choice.drafts], dtype=input_ids.dtype, device=input_ids.device)
            return RoundPlan("lookup", drafts=drafts)
        return RoundPlan("draft", num_drafts=choice.drafts)

    def _estimate(self, key: str) -> AcceptanceEstimate:
        """This call's estimate for a source ("draft") or a bucket of matched lengths, made on first use with the
        memory's estimate of the same key as parent."""
        if key not in self.estimates:
            max_drafts = self.block_size - 1 if key == "draft" else self.max_suffix_drafts
            self.estimates[key] = AcceptanceEstimate(max_drafts, parent=self.memory.estimate(key, max_drafts))
        return self.estimates[key]

    def drafted(self, num_drafts: int) -> None:
        """The drafter proposed `num_drafts` drafts (fewer than planned only at the end of the length budget)."""
        if self.last is not None and self.last[0] == "draft":
            self.last = ("draft", num_drafts)


# -- calibration -----------------------------------------------------------------------------------------------------
# Part of the cache key: a curve timed the older way (each length's repeats back to back) is timed again
CALIBRATION_METHOD = "interleaved"

def _cache_file(key: Mapping[str, str]) -> Path:
    root = os.environ.get("CARRYOVER_HF_CACHE")
    base = Path(root).expanduser() if root else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "carryover-hf"
    name = "-".join("".join(c if c.isalnum() or c in "._" else "_" for c in value) for value in key.values())
    return base / "verification-cost" / f"{name}.json"


@torch.no_grad()
def calibrate(
    target,
    max_drafts: int,
    context_length: int = 256,
    repeats: int = 9,
    cache: bool = True,
) -> VerificationCost:
    """Times the target's forward over 1..max_drafts + 1 new tokens after a `context_length`-token prefix, relative to
    its 1-token step (the device synchronised): `repeats` passes over every length in turn, after one warm-up pass,
    and each length's median. Interleaved passes, not one length's repeats back to back, so that a change of load
    on the machine (another process on a shared core) slows every length alike instead of bending the curve. Read
    from / written to the on-disk cache keyed by (model name, device, dtype, threads) unless `cache=False`."""
    from transformers import DynamicCache

    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    # what decides the curve's shape besides device, dtype and threads: the architecture and the kernels it runs
    # (module classes: the CPU kernels swap in packed linears; and a module's `kernel_key` where it has one: how the
    # packed linears run the fewest rows on this machine), as a short digest
    kernels = {type(m).__name__ + getattr(m, "kernel_key", "") for m in target.modules()}
    layout = target.config.to_json_string(use_diff=False) + ",".join(sorted(kernels))
    key = {"model": str(getattr(target.config, "_name_or_path", "") or type(target).__name__), "device": str(device),
           "dtype": str(dtype).replace("torch.", ""), "threads": str(torch.get_num_threads()),
           "max_drafts": str(max_drafts), "layout": hashlib.sha256(layout.encode()).hexdigest()[:10],
           "method": CALIBRATION_METHOD}  # fmt: skip
    path = _cache_file(key)
    if cache and path.is_file():
        return VerificationCost(json.loads(path.read_text())["relative"])
    logger.info(f"Timing the target's forward over 1 to {max_drafts + 1} new tokens once; cached in {path}.")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    vocab = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context_length), generator=generator).to(device)
    past = DynamicCache()
    target(prefix, **{CACHE_ARGUMENT: past}, use_cache=True)
    tokens = [torch.randint(0, vocab, (1, k + 1), generator=generator).to(device) for k in range(max_drafts + 1)]
    samples: list[list[float]] = [[] for _ in tokens]
    for _ in range(repeats + 1):  # the first pass is a warm-up
        for k, new in enumerate(tokens):
            sync()
            start = time.perf_counter()
            target(new, **{CACHE_ARGUMENT: past}, use_cache=True)
            sync()
            samples[k].append(time.perf_counter() - start)
            past.crop(-(k + 1))  # negative: the releases of the supported range all take it
    times = [sorted(s[1:])[len(s[1:]) // 2] for s in samples]
    cost = VerificationCost([t / times[0] for t in times])
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "relative": cost.relative}, indent=2) + "\n")
    return cost


__all__ = [
    "AcceptanceEstimate",
    "AcceptanceMemory",
    "Choice",
    "CostAwarePolicy",
    "MeasuredCost",
    "ModelledCost",
    "ROUND_POLICY_STATE_ATTRIBUTE",
    "RateEstimate",
    "RoundPolicyState",
    "VerificationCost",
    "best_proposal",
    "calibrate",
    "suffix_estimate_key",
]
