"""Carry overhead in isolation: one proposal of the same drafter on the same recorded context, with and without carry.

For each context length L the target runs once over a recorded token sequence; its states at positions `< L` fill the
drafter's context buffer (the `DrafterContextBuffer` that `generate` uses), and its states at `L .. L+B-2` serve as
the carry segment (B-1 rows, the most a round can carry). A timed proposal is what a greedy decoding round does: the
drafter forward over `[anchor, MASK x (B-1)]` with the round's new context rows (`new_context_rows`, default 1: a
round of `generate` always brings at least the rows it accepted, bonus included, and their fusion runs in the same
call as the carry's) plus the greedy drafts as `generate` picks them (`drafter.propose` on the draft head built once
per pairing: LM head, a Markov drafter's transition term, argmax). The new context rows are
the last ones before L; the buffer is set back after each proposal, so every proposal sees the same context.
`new_context_rows=0` times a proposal with nothing new to fuse, which no round of `generate` makes: there the carry
pays the whole context-fusion layer (a weight pass of its own) and the overhead reads several times larger.
Every timed proposal follows a timed target 1-token step on the same L-token context (one forward with the LM head,
on a `DynamicCache`, cropped back after each step), as every proposal of `generate` follows the target's verification
forward: the target's weight stream evicts the drafter's weights from the caches, so both proposals start from the
same cold caches (proposals with 0 and with B-1 carry rows take turns going first). Before 2026-12-03 the order was
(no carry, carry, step) then (step, carry, no carry): the carry proposal followed a target step in every other
repeat and the proposal without carry never did, which charged the carry with refilling the caches; the timed
proposal also gathered the draft head's rows on every call (generate gathers them once) and left a Markov drafter's
transition term out (docs/bench.md has the figures of both orders). Drift affects all three, and the proposal can be
stated as a fraction of a target step measured in the same loop.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache

from ...compatibility import CACHE_ARGUMENT
from ...features import gather_target_features, hidden_state_indices
from ...generation import DrafterProposer
from ...modeling_carryover import CarryoverDrafterModel, DrafterContextBuffer
from ...utils import device_synchronizer
from .stats import DEFAULT_CONFIDENCE, DEFAULT_RESAMPLES, bootstrap_interval, mean, mean_difference, ratio_of_sums


def check_new_context_rows(new_context_rows: int, context_lengths: Sequence[int], name: str = "new_context_rows") -> None:
    """The new context rows of a timed proposal come from before the shortest context length: [0, min(L))."""
    if not 0 <= new_context_rows < min(context_lengths):
        raise ValueError(
            f"{name} must lie in [0, {min(context_lengths)}) (below the shortest context length), got {new_context_rows}"
        )


def _time_proposal(proposer: DrafterProposer, observed, prefix_ids, committed: int, sync) -> float:
    """Milliseconds of one proposal of generate's own `DrafterProposer` (drafter forward over the block, the round's
    new context rows and the carry on its context buffer, then the greedy drafts as `generate` picks them), after it
    observed `observed` = `(verified rows, number accepted)` as after a verification; `prefix_ids` ends with the
    anchor. The proposer is set back to `committed` context rows afterwards (outside the timing), so the next proposal
    fuses the same new rows again."""
    proposer.observe(*observed)
    sync()
    start = time.perf_counter()
    proposer.propose(prefix_ids, proposer.config.block_size - 1)
    sync()
    elapsed = (time.perf_counter() - start) * 1000.0
    proposer.rewind(committed)
    return elapsed


def _time_target_step(target, token, cache, sync) -> float:
    """Milliseconds of one target forward over one token (LM head included) on top of `cache`, then cropped back."""
    sync()
    start = time.perf_counter()
    target(token, **{CACHE_ARGUMENT: cache}, use_cache=True)
    sync()
    elapsed = (time.perf_counter() - start) * 1000.0
    cache.crop(-1)
    return elapsed


def record_features(target: PreTrainedModel, drafter: CarryoverDrafterModel, token_ids: torch.LongTensor):
    """One target forward over a recorded sequence `(1, n)`: its token ids on the target's device and the fused-layer
    states the drafter reads, `(1, n, k * H_target)` on the drafter's device."""
    ids = token_ids.to(target.device)
    outputs = target(ids, output_hidden_states=hidden_state_indices(drafter.config.target_layer_ids))
    return ids, gather_target_features(outputs.hidden_states, drafter.config.target_layer_ids).to(drafter.device)


class RecordedRound:
    """One greedy round of `generate` at context length L, rebuilt from a recorded sequence so it can be timed again
    and again with generate's own `DrafterProposer`: its context buffer holds the rows before the round's
    `new_context_rows` (as the rounds before it would have left it), the round observes the new rows (accepted) and
    the states at `L .. L+B-2` (rejected: the carry), the block is `[token L, MASK x (B-1)]`, and the target's cache
    holds the L tokens. `time(with_carry)` runs a target 1-token step (which leaves the caches as a verification
    forward does) and then the proposal; the proposer and the target's cache are set back after each."""

    def __init__(self, target, drafter, head, ids, features, length: int, new_context_rows: int):
        block_size = drafter.config.block_size
        self.target, self.drafter, self.head = target, drafter, head
        self.sync = device_synchronizer(drafter.device)
        self.committed = length - new_context_rows
        self.proposer = DrafterProposer(drafter, target.get_input_embeddings(), head, max_length=length + block_size)
        # The rounds before: the context before the new rows is committed by a proposal (its drafts are not used).
        self.proposer.observe(features[:, : self.committed], self.committed)
        self.proposer.propose(ids[:, : self.committed + 1], 1)
        # What the round's verification leaves: the new rows (accepted), then with carry the B-1 rejected ones.
        self.observed = {
            False: (features[:, self.committed : length], new_context_rows),
            True: (features[:, self.committed : length + block_size - 1], new_context_rows),
        }
        self.prefix_ids = ids[:, : length + 1]  # ends with the anchor
        self.target_cache = DynamicCache(config=target.config)
        target(ids[:, :length], **{CACHE_ARGUMENT: self.target_cache}, use_cache=True)
        self.token = ids[:, length : length + 1]

    @property
    def cache(self) -> DrafterContextBuffer:
        return self.proposer.context_cache

    def time(self, with_carry: bool) -> tuple[float, float]:
        """Milliseconds of a target 1-token step and of the proposal right after it (with B-1 carry rows or none)."""
        step_ms = _time_target_step(self.target, self.token, self.target_cache, self.sync)
        observed = self.observed[with_carry]
        proposal_ms = _time_proposal(self.proposer, observed, self.prefix_ids, self.committed, self.sync)
        return step_ms, proposal_ms

    def check(self) -> None:
        """Every proposal must have seen the same context."""
        if self.cache.get_seq_length() != self.committed:
            raise RuntimeError(f"context cache holds {self.cache.get_seq_length()} rows after timing (expected {self.committed})")


@torch.no_grad()
def measure_carry_overhead(
    target: PreTrainedModel,
    drafter: CarryoverDrafterModel,
    token_ids: torch.LongTensor,
    context_lengths: Sequence[int] = (128, 512, 2048),
    repeats: int = 30,
    warmup: int = 3,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    progress: bool = True,
    new_context_rows: int = 1,
) -> dict:
    """Time proposals with 0 and with B-1 carry rows at each context length; returns every timing and its summary.

    `token_ids` (`(1, n)`, a recorded sequence, e.g. prompts followed by the target's own answers) must be at least
    `max(context_lengths) + block_size - 1` long. Times are in milliseconds.
    """
    block_size = drafter.config.block_size
    num_carry = block_size - 1
    if token_ids.dim() != 2 or token_ids.shape[0] != 1:
        raise ValueError(f"token_ids must have shape (1, n), got {tuple(token_ids.shape)}")
    if repeats < 2:
        raise ValueError(f"repeats must be at least 2 to give an interval, got {repeats}")
    check_new_context_rows(new_context_rows, context_lengths)
    needed = max(context_lengths) + num_carry
    if token_ids.shape[1] < needed:
        raise ValueError(
            f"the recorded sequence has {token_ids.shape[1]} tokens; context length {max(context_lengths)} plus "
            f"{num_carry} carry rows needs {needed}. Lower the context lengths or record a longer sequence."
        )
    limit = getattr(target.config.get_text_config(), "max_position_embeddings", None)
    if limit is not None and needed + 1 > limit:
        raise ValueError(f"context length {max(context_lengths)} + block exceeds the target's {limit} positions")

    ids, features = record_features(target, drafter, token_ids[:, :needed])
    head = drafter.draft_head(target.get_output_embeddings())
    results = []
    bar = tqdm(total=len(context_lengths) * (repeats + warmup), desc="carry overhead", disable=not progress)
    for length in context_lengths:
        round_ = RecordedRound(target, drafter, head, ids, features, length, new_context_rows)
        times = {False: [], True: []}  # proposal ms without / with carry
        steps = {False: [], True: []}  # ms of the target step right before each of them
        for step in range(warmup + repeats):
            for with_carry in (False, True) if step % 2 == 0 else (True, False):
                step_ms, proposal_ms = round_.time(with_carry)
                if step >= warmup:
                    steps[with_carry].append(step_ms)
                    times[with_carry].append(proposal_ms)
            bar.update(1)
        round_.check()
        off, on = np.array(times[False]), np.array(times[True])
        step_ms = np.array(steps[False] + steps[True])
        interval = {"n_resamples": n_resamples, "confidence": confidence, "seed": seed}
        difference = bootstrap_interval([on, off], mean_difference, **interval)
        # Paired samples of equal length: a ratio of sums is the ratio of their means.
        relative = bootstrap_interval([on, off], lambda a, b, axis=-1: ratio_of_sums(a, b, axis) - 1, **interval)
        over_step = {
            name: bootstrap_interval([x, np.array(steps[carried])], ratio_of_sums, **interval).to_dict()
            for name, x, carried in (("proposal_without_carry_per_target_step", off, False),
                                     ("proposal_with_carry_per_target_step", on, True))  # fmt: skip
        }
        results.append(
            {
                "context_length": int(length),
                "carry_rows": num_carry,
                "new_context_rows": int(new_context_rows),
                "ms_without_carry": bootstrap_interval([off], mean, **interval).to_dict(),
                "ms_with_carry": bootstrap_interval([on], mean, **interval).to_dict(),
                "median_ms_without_carry": float(np.median(off)),
                "median_ms_with_carry": float(np.median(on)),
                "overhead_ms": difference.to_dict(),
                "overhead_relative": relative.to_dict(),
                "target_step_ms": bootstrap_interval([step_ms], mean, **interval).to_dict(),
                "median_target_step_ms": float(np.median(step_ms)),
                **over_step,
                "times_ms_without_carry": off.tolist(),
                "times_ms_with_carry": on.tolist(),
                "times_ms_target_step": step_ms.tolist(),  # before the proposals without carry, then before those with
            }
        )
    bar.close()
    return {
        "block_size": block_size,
        "repeats": repeats,
        "proposal_follows_target_step": True,  # the order since 2026-12-03 (see the module docstring)
        "warmup": warmup,
        "device": str(drafter.device),
        "dtype": str(drafter.dtype).removeprefix("torch."),
        "new_context_rows": int(new_context_rows),
        "what_is_timed": "proposal: drafter forward over one block and the round's new context rows on the generation "
        "context buffer + greedy drafts as generate picks them "
        "(drafter.propose: LM head, a Markov drafter's transition term, argmax over the B-1 proposal rows), each right "
        "after a target step; target step: one target forward over one token on an L-token "
        "cache (LM head included)",
        "by_context_length": results,
    }


__all__ = ["check_new_context_rows", "measure_carry_overhead"]
