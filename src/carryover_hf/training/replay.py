"""Greedy decoding replayed on recorded rows: the rounds a full-block greedy `generate` call makes on them.

`tau_teacher_forced` averages `1 + leading correct drafts` over anchors drawn uniformly from the responses. Decoding
anchors each round where the last one ended (`a + accepted + 1`), so it meets a hard stretch once per token and an
easy one once per long round: its acceptance length (tokens / rounds) is a different average of the same per-anchor
numbers, lower wherever acceptance varies along a response. On SmolLM2-135M's held-out rows the uniform average was
3.10 and the decoding one 2.41 (campaign milestone 4).

Here every anchor of a row is drafted (in chunks, as one packed drafter forward each), then the rounds are walked:
each response segment starts at its first token (the one the prefill produces), and each round advances by its
anchor's `1 + accepted`, at most to the segment's end. Drafts read only the recorded prefix, so on rows that are the
target's own greedy output the walk is the decoding's own sequence of rounds (tested against `generate`): its tau
is the drafter-alone tau of full-block greedy decoding with the carry segment off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..regenerated import response_spans
from .collator import valid_anchor_positions
from .losses import block_labels, leading_matches
from .verification import target_forward


@torch.no_grad()
def anchor_acceptance(objective, drafter, row: dict, max_tokens: int | None = None, chunk: int = 256) -> torch.LongTensor:
    """`(T,)`: at each anchor of the row (a and a + 1 response tokens; with `max_tokens`, only those a replay of the
    first `max_tokens` tokens of each response can reach) `1 + accepted drafts` of the block the drafter proposes
    there (greedy, as `generate` picks); 0 elsewhere.

    `row` holds `input_ids` and `loss_mask` and, from a `FeatureStore`, `target_features`; without them the target
    (`objective.target`) is run once over the row.
    """
    from .objectives import block_ids

    size = drafter.config.block_size
    loss_mask = torch.as_tensor(row["loss_mask"])
    anchors_all = torch.as_tensor(valid_anchor_positions(loss_mask.numpy()), dtype=torch.long)
    if max_tokens is not None:
        reach = torch.zeros(len(loss_mask), dtype=torch.bool)
        for first, stop in response_spans(loss_mask.tolist()):
            reach[first : _last_replayed(first, stop, max_tokens)] = True
        anchors_all = anchors_all[reach[anchors_all]]
    input_ids = torch.as_tensor(row["input_ids"], dtype=torch.long, device=drafter.device)[None]  # (1, T): one row
    if "target_features" in row:
        features = torch.as_tensor(row["target_features"]).to(drafter.device, drafter.dtype)[None]
    else:
        features = target_forward(objective.target, input_ids, torch.ones_like(input_ids),
                                  drafter.config.target_layer_ids).features  # fmt: skip
    loss_mask = loss_mask.to(drafter.device)[None]
    tau = torch.zeros(input_ids.shape[1], dtype=torch.long, device=drafter.device)
    for lo in range(0, len(anchors_all), chunk):
        anchors = anchors_all[lo : lo + chunk].to(drafter.device)[None]
        valid = torch.ones_like(anchors, dtype=torch.bool)
        blocks = block_ids(input_ids, anchors, size, drafter.config.mask_token_id)
        labels, label_valid = block_labels(input_ids, loss_mask, anchors, valid, size)
        hidden = objective.run_drafter(drafter, drafter, blocks, anchors, features)
        drafts = objective.greedy_drafts(drafter, hidden, blocks[..., 0])
        tau[anchors[0]] = leading_matches(drafts, labels, label_valid)[0] + 1
    return tau.cpu()


def _last_replayed(first: int, stop: int, max_tokens: int | None) -> int:
    """The position of the last token a replay of response span `[first, stop)` reaches (its first `max_tokens`)."""
    return stop - 1 if max_tokens is None else min(stop - 1, first + max_tokens - 1)


def replay_rounds(tau: Sequence[int], loss_mask: Sequence[int], max_tokens: int | None = None) -> list[int]:
    """Tokens per round of greedy decoding over each response segment (at most its first `max_tokens` tokens, as
    `max_new_tokens` would stop it), from `anchor_acceptance`."""
    rounds = []
    for first, stop in response_spans(loss_mask):
        end = _last_replayed(first, stop, max_tokens)
        position = first  # produced by the prefill; every round then drafts from the last token it has
        while position < end:
            step = max(1, min(int(tau[position]), end - position))
            rounds.append(step)
            position += step
    return rounds


def decoding_tau(objective, drafter, rows: Iterable[dict], max_tokens: Sequence[int | None] = (None,)) -> dict:
    """Acceptance length of replayed greedy decoding over `rows`, pooled (tokens / rounds), per entry of `max_tokens`
    (`None`: whole responses): `{max_tokens: tau}`."""
    totals = {limit: [0, 0] for limit in max_tokens}
    reach = None if None in max_tokens else max(max_tokens)
    for row in rows:
        tau = anchor_acceptance(objective, drafter, row, reach)
        for limit in max_tokens:
            rounds = replay_rounds(tau.tolist(), torch.as_tensor(row["loss_mask"]).tolist(), limit)
            totals[limit][0] += sum(rounds)
            totals[limit][1] += len(rounds)
    return {limit: tokens / count if count else float("nan") for limit, (tokens, count) in totals.items()}


__all__ = ["anchor_acceptance", "decoding_tau", "replay_rounds"]
