"""Cost-aware choice of a round's proposal: which source and how many drafts, from past rounds only.

A round verifies `k` drafts in one target forward over `k + 1` tokens and returns `1 + (accepted drafts)` tokens.
With `a_j` the chance that draft j is accepted given that drafts 1..j-1 were, the expected tokens of a round are
`1 + sum_{j<=k} prod_{i<=j} a_i`, and its cost, in 1-token target steps, is `verify(k) + proposal`. The policy takes,
per source (a drafter, a context lookup, a suffix cache: whatever offers drafts this round), the `k` that maximises
expected tokens per unit of cost, and the best source; a plain step (k = 0, cost 1, one token) is always a candidate,
so a round is never expected to be worse than the target alone.

* `VerificationCost`: `verify(k)`, the cost of a forward over `k + 1` new tokens relative to a 1-token step, from a
  short calibration on the target's own device, dtype and thread count (`calibrate`), cached on disk per
  (model, device, dtype, threads), or given (`VerificationCost.flat()`: every forward costs one step, as on a GPU
  where a block is nearly free).
* `AcceptanceEstimate`: per source, the conditional acceptance of each draft position, a Beta prior updated by each
  verified round (`observe(drafted, accepted)`); it reads only rounds already verified, which is what keeps the
  choice lossless: it never looks at the target's output for the round being chosen.
* `best_proposal`: the choice.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch


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

    def conditional(self) -> list[float]:
        return [(a + self.prior_accept) / (r + self.prior_accept + self.prior_reject)
                for a, r in zip(self.accepted, self.reached)]  # fmt: skip

    def expected_tokens(self, k: int) -> float:
        """1 + expected accepted drafts when k are offered."""
        total, survive = 1.0, 1.0
        for rate in self.conditional()[:k]:
            survive *= rate
            total += survive
        return total


@dataclass(frozen=True)
class Choice:
    source: str | None  # None: a plain target step
    drafts: int
    tokens_per_cost: float


def best_proposal(
    estimates: Mapping[str, AcceptanceEstimate],
    available: Mapping[str, int],
    cost: VerificationCost,
    proposal_cost: Mapping[str, float] | None = None,
    drafts_only: bool = False,
) -> Choice:
    """The source and draft count with the most expected tokens per unit of cost (a plain step scores 1.0; with
    `drafts_only` it is no candidate, and the best proposal is returned even if it scores below 1).

    `available[source]` is how many drafts the source can offer this round (0 or absent: none); `proposal_cost` the
    cost of producing them, in 1-token steps (a drafter forward; a lookup is about free)."""
    best = Choice(None, 0, float("-inf") if drafts_only else 1.0)
    for source, offered in available.items():
        if offered <= 0 or source not in estimates:
            continue
        overhead = (proposal_cost or {}).get(source, 0.0)
        for k in range(1, offered + 1):
            value = estimates[source].expected_tokens(k) / (cost.verify(k) + overhead)
            if value > best.tokens_per_cost + 1e-12:
                best = Choice(source, k, value)
    return best


class CostAwarePolicy:
    """A round policy with `ProposalPolicy`'s interface (`plan`, `drafted`, `confidence`, `lookup_drafts`) that picks
    the source and draft count by `best_proposal`: the drafter (up to block size - 1 drafts, at `drafter_cost` steps a
    proposal) or a suffix match (`SuffixSession`: the live sequence and, with a shared `SuffixCache`, earlier calls;
    drafts with one-hot distributions under sampling, as a context lookup), else a plain step.

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
        max_suffix_drafts: int = 16,
        decay: float = 0.98,
        probe_after: int = 2,
        max_probe_after: int = 32,
    ):
        self.block_size, self.max_length, self.cost = block_size, max_length, cost
        self.suffix = suffix_session
        self.drafter_cost = drafter_cost
        self.confidence = None  # no confidence cut: the length is chosen here
        self.lookup_drafts = max_suffix_drafts if suffix_session is not None else None
        self.estimates = {"draft": AcceptanceEstimate(block_size - 1, decay=decay)}
        if suffix_session is not None:
            self.estimates["lookup"] = AcceptanceEstimate(max_suffix_drafts, decay=decay)
        self.max_suffix_drafts = max_suffix_drafts
        self.probe_after, self.max_probe_after = probe_after, max_probe_after
        self.interval = probe_after
        self.plain_streak = 0
        self.last: tuple[str, int] | None = None  # (source, drafts) of the round just verified
        self.probing = False
        self.choices: list[Choice] = []  # one per planned round (statistics; the benchmark reads them)

    def plan(self, input_ids: torch.LongTensor, first_draft_accepted: bool, accepted_drafts: int | None = None):
        from .generation import RoundPlan

        if accepted_drafts is None:
            accepted_drafts = int(first_draft_accepted)  # a lower bound when only the first draft's fate is known
        if self.last is not None:
            source, drafted = self.last
            self.estimates[source].observe(drafted, accepted_drafts)
            if self.probing:
                self.interval = self.probe_after if accepted_drafts > 0 else min(2 * self.interval, self.max_probe_after)
        self.last, self.probing = None, False
        room = self.max_length - input_ids.shape[1] - 1
        if room <= 0:
            return RoundPlan("end")
        available = {"draft": min(self.block_size - 1, room)}
        suffix_drafts = None
        if self.suffix is not None:
            new = input_ids[0, len(self.suffix.tokens) :].tolist()
            self.suffix.extend(new)
            proposal = self.suffix.propose(min(self.max_suffix_drafts, room))
            if proposal is not None:
                suffix_drafts = proposal.tokens
                available["lookup"] = len(suffix_drafts)
        choice = best_proposal(self.estimates, available, self.cost, {"draft": self.drafter_cost})
        if choice.source is None and self.plain_streak + 1 >= self.interval:  # a probe: the best proposal there is
            costs = {"draft": self.drafter_cost}
            choice, self.probing = best_proposal(self.estimates, available, self.cost, costs, drafts_only=True), True
        self.choices.append(choice)
        if choice.source is None:
            self.plain_streak += 1
            return RoundPlan("plain")
        self.plain_streak = 0
        self.last = (choice.source, choice.drafts)
        if choice.source == "lookup":
            drafts = torch.tensor(suffix_drafts[: choice.drafts], dtype=input_ids.dtype, device=input_ids.device)
            return RoundPlan("lookup", drafts=drafts)
        return RoundPlan("draft", num_drafts=choice.drafts)

    def drafted(self, num_drafts: int) -> None:
        """The drafter proposed `num_drafts` drafts (fewer than planned only at the end of the length budget)."""
        if self.last is not None and self.last[0] == "draft":
            self.last = ("draft", num_drafts)


# -- calibration -----------------------------------------------------------------------------------------------------
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
    repeats: int = 5,
    cache: bool = True,
) -> VerificationCost:
    """Times the target's forward over 1..max_drafts + 1 new tokens after a `context_length`-token prefix (median of
    `repeats`, the device synchronised), relative to its 1-token step; read from / written to the on-disk cache keyed by
    (model name, device, dtype, threads) unless `cache=False`."""
    from transformers import DynamicCache

    device, dtype = next(target.parameters()).device, next(target.parameters()).dtype
    key = {"model": str(getattr(target.config, "_name_or_path", "") or type(target).__name__), "device": str(device),
           "dtype": str(dtype).replace("torch.", ""), "threads": str(torch.get_num_threads()),
           "max_drafts": str(max_drafts)}  # fmt: skip
    path = _cache_file(key)
    if cache and path.is_file():
        return VerificationCost(json.loads(path.read_text())["relative"])
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    vocab = target.config.get_text_config().vocab_size
    generator = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context_length), generator=generator).to(device)
    past = DynamicCache()
    target(prefix, past_key_values=past, use_cache=True)
    times = []
    for k in range(max_drafts + 1):
        tokens = torch.randint(0, vocab, (1, k + 1), generator=generator).to(device)
        samples = []
        for _ in range(repeats + 1):  # the first is a warm-up
            sync()
            start = time.perf_counter()
            target(tokens, past_key_values=past, use_cache=True)
            sync()
            samples.append(time.perf_counter() - start)
            past.crop(-(k + 1))  # negative: the releases of the supported range all take it
        times.append(sorted(samples[1:])[len(samples[1:]) // 2])
    cost = VerificationCost([t / times[0] for t in times])
    if cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": key, "relative": cost.relative}, indent=2) + "\n")
    return cost


__all__ = ["AcceptanceEstimate", "Choice", "CostAwarePolicy", "VerificationCost", "best_proposal", "calibrate"]
