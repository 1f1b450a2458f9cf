"""Where a drafter's block queries look: the share of their attention on context, carry and block rows.

The mechanism behind carryover is that the next proposal reads the target's states at the drafts it just rejected
(the carry rows). Whether a trained drafter uses them shows in its attention: `attention_shares` runs `generate` with
the drafter's attention swapped for an eager one that records, for every proposal and layer, the attention mass of the
block queries (averaged over heads and queries) on each key row, and splits it into context, carry and block rows:

    shares = attention_shares(target, drafter, [input_ids, ...], max_new_tokens=128)
    shares["carry_share"]      # mean mass on carry rows, over proposals that had any
    shares["carry_per_row"]    # the same per carry row, over the mass per context row: > 1 favours a carry row
    shares["carry_over_recent_context"]  # carry mass over the mass of as many of the latest context rows

Every round is a drafter proposal with carry on (rules policy, no lookup, no backoff); the eager attention gives the
same proposals as sdpa up to rounding, and the output stays the target's own either way.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

PROBE = "carryover_carry_probe"


class _Recorder:
    """Per drafter forward (one call per layer), the attention mass of the block queries on each key row."""

    def __init__(self):
        self.calls: list[tuple[int, torch.Tensor, int]] = []  # (layer, mass per key row, query rows)

    def __call__(self, module, query, key, value, attention_mask, **kwargs):
        from ..modeling_carryover import eager_attention_forward  # the drafter's own eager path

        output, weights = eager_attention_forward(module, query, key, value, attention_mask, **kwargs)
        # weights: (batch, heads, queries, keys) -> the mean over batch, heads and queries of each key row's mass
        self.calls.append((module.layer_idx, weights.detach().float().mean(dim=(0, 1, 2)).cpu(), query.shape[2]))
        return output, weights


_ACTIVE: list[_Recorder] = []


def _probe(module, query, key, value, attention_mask, **kwargs):
    return _ACTIVE[-1](module, query, key, value, attention_mask, **kwargs)


@contextmanager
def recording(drafter):
    """Within the block, the drafter's attention records its weights (registered under `PROBE` on first use)."""
    from transformers import AttentionInterface

    AttentionInterface.register(PROBE, _probe)
    recorder, previous = _Recorder(), drafter.config._attn_implementation
    _ACTIVE.append(recorder)
    drafter.config._attn_implementation = PROBE
    try:
        yield recorder
    finally:
        drafter.config._attn_implementation = previous
        _ACTIVE.remove(recorder)


def split_shares(recorder: _Recorder, carry_rows: list[int], num_layers: int) -> list[dict[str, Any]]:
    """Per proposal and layer: the mass on context, carry and block rows, and the rows of each."""
    if len(recorder.calls) != num_layers * len(carry_rows):
        raise RuntimeError(f"{len(recorder.calls)} attention calls for {len(carry_rows)} proposals of {num_layers} "
                           "layers: the probe's calls do not line up with the proposals")  # fmt: skip
    shares = []
    for index, (layer, mass, queries) in enumerate(recorder.calls):
        carry = carry_rows[index // num_layers]
        context = mass.numel() - queries - carry
        recent = min(carry, context)  # the context rows right before the carry rows, as many as there are carry rows
        shares.append({
            "layer": layer, "context_rows": context, "carry_rows": carry, "block_rows": queries,
            "context": float(mass[:context].sum()), "carry": float(mass[context : context + carry].sum()),
            "block": float(mass[context + carry :].sum()), "recent_context": float(mass[context - recent : context].sum()),
        })  # fmt: skip
    return shares


@torch.no_grad()
def attention_shares(target, drafter, prompts: list[torch.LongTensor], max_new_tokens: int = 128) -> dict[str, Any]:
    """Greedy generation of each prompt with carry on; the block queries' attention split by row kind (see above)."""
    from transformers import GenerationConfig

    from ..utils import pad_token_id

    config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, use_carryover=True, round_policy="rules",
                              lookup_drafts=0, proposal_backoff=0, draft_confidence_threshold=0.0,
                              pad_token_id=pad_token_id(target.generation_config))  # fmt: skip
    layers = drafter.config.num_hidden_layers
    shares = []
    for input_ids in prompts:
        with recording(drafter) as recorder:
            target.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config,
                            assistant_model=drafter)  # fmt: skip
        shares += split_shares(recorder, list(drafter.last_generation_stats.carry_rows), layers)
    return summarize(shares, layers)


def summarize(shares: list[dict[str, Any]], num_layers: int) -> dict[str, Any]:
    """Means over proposals (and per layer) of the shares, the carry ones over proposals that had carry rows."""

    def means(rows: list[dict[str, Any]]) -> dict[str, Any]:
        with_carry = [r for r in rows if r["carry_rows"] and r["context_rows"]]
        out: dict[str, Any] = {"proposals": len(rows), "proposals_with_carry": len(with_carry)}
        for kind in ("context", "carry", "block"):
            source = with_carry if kind == "carry" else rows
            out[f"{kind}_share"] = sum(r[kind] for r in source) / len(source) if source else None
        # Mass per carry row over mass per context row, in the same proposals: > 1 when a carry row draws more
        # attention than a context row does.
        ratios = [(r["carry"] / r["carry_rows"]) / (r["context"] / r["context_rows"])
                  for r in with_carry if r["context"] > 0]  # fmt: skip
        out["carry_per_row"] = sum(ratios) / len(ratios) if ratios else None
        # ... and over the mass of as many of the latest context rows (nearby positions draw more attention anyway)
        recent = [r["carry"] / r["recent_context"] for r in with_carry if r["recent_context"] > 0]
        out["carry_over_recent_context"] = sum(recent) / len(recent) if recent else None
        out["mean_carry_rows"] = sum(r["carry_rows"] for r in with_carry) / len(with_carry) if with_carry else 0.0
        return out

    return {**means(shares), "layers": [means([r for r in shares if r["layer"] == i]) for i in range(num_layers)]}


__all__ = ["PROBE", "attention_shares", "recording", "split_shares", "summarize"]
