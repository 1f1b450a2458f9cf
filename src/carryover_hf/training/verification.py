"""The frozen target at training time: one pass over each sequence, then parallel verification of all first drafts.

Parallel verification computes, in one forward over the cached prefix, what inference-time verification computes
round by round: for every anchor `a`, the target's states at rows `[x_a, d_1 .. d_{B-1}]` (positions `a .. a+B-1`),
each row seeing the prefix `< a` and the causal part of its own block. The prefix cache is the target's KV cache of
the single pass over `x`; the verify rows see only the part of it before their anchor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.cache_utils import DynamicCache

from ..compatibility import CACHE_ARGUMENT
from ..features import gather_target_features, hidden_state_indices
from ..masks import PackedBlocks, backend_mask

SUPPORTED_ATTENTION = ("sdpa", "eager", "flex_attention")


@dataclass
class TargetStates:
    """What the target computed over a batch of sequences or verify rows.

    features (`(b, n, k * H)`): the fused-layer inputs the drafter reads (`target_layer_ids`).
    last_hidden_state (`(b, n, H)`, optional): final-norm states, for the target's own next-token distribution.
    past_key_values (optional): the KV cache of the pass (the prefix cache for parallel verification).
    """

    features: torch.Tensor
    last_hidden_state: torch.Tensor | None = None
    past_key_values: DynamicCache | None = None


def check_target_attention(target: PreTrainedModel) -> str:
    """The target's attention backend, if it takes the custom 4D masks of parallel verification."""
    implementation = target.config._attn_implementation
    if implementation not in SUPPORTED_ATTENTION:
        raise ValueError(
            f"The target uses attn_implementation={implementation!r}, which cannot take the block-diagonal masks of "
            f"parallel verification. Load it with attn_implementation in {SUPPORTED_ATTENTION} (sdpa on CPU, "
            "flex_attention on GPU)."
        )
    return implementation


def _requested_layers(target: PreTrainedModel, target_layer_ids: list[int], with_last: bool) -> list[int]:
    last_layer = target.config.get_text_config().num_hidden_layers - 1  # its entry is the final-norm output
    return sorted(set(hidden_state_indices([*target_layer_ids, *([last_layer] if with_last else [])])))


@torch.no_grad()
def target_forward(
    target: PreTrainedModel,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None,
    target_layer_ids: list[int],
    use_cache: bool = False,
    with_last_hidden_state: bool = False,
) -> TargetStates:
    """One pass of the target over whole sequences: context features for every position (and its cache)."""
    # A cache without the config keeps every layer's full history: sliding-window layers would otherwise crop the
    # prefix that parallel verification reads (the window is enforced by the mask instead).
    cache = DynamicCache() if use_cache else None
    outputs = target(
        input_ids=input_ids,
        attention_mask=attention_mask,
        **{CACHE_ARGUMENT: cache},
        use_cache=use_cache,
        output_hidden_states=_requested_layers(target, target_layer_ids, with_last_hidden_state),
        logits_to_keep=1,  # logits are computed only where needed, from the final-norm states
    )
    last = outputs.hidden_states[-1] if with_last_hidden_state else None
    return TargetStates(gather_target_features(outputs.hidden_states, target_layer_ids), last, cache)


def verify_attention_mask(target: PreTrainedModel, packed: PackedBlocks, dtype: torch.dtype):
    """The verify mask in the target's backend format; a per-layer-type dict for models with sliding layers."""
    implementation = check_target_attention(target)
    text = target.config.get_text_config()
    window = getattr(text, "sliding_window", None)
    layer_types = getattr(text, "layer_types", None)
    full = backend_mask(packed, implementation, dtype, causal=True)
    if layer_types is not None:
        unknown = set(layer_types) - {"full_attention", "sliding_attention"}
        if unknown:
            raise NotImplementedError(
                f"Parallel verification supports full and sliding-window attention layers; this target also has "
                f"{sorted(unknown)}."
            )
        if "sliding_attention" not in layer_types:
            return full
        sliding = backend_mask(packed, implementation, dtype, causal=True, sliding_window=window)
        return {"full_attention": full, "sliding_attention": sliding}
    if window is not None:  # Mistral-style: every layer slides
        return backend_mask(packed, implementation, dtype, causal=True, sliding_window=window)
    return full


@torch.no_grad()
def parallel_verify(
    target: PreTrainedModel,
    prefix_cache: DynamicCache,
    block_ids: torch.LongTensor,
    anchors: torch.LongTensor,
    target_layer_ids: list[int],
    with_last_hidden_state: bool = False,
) -> TargetStates:
    """Target states at every row of every drafted block, in one forward over the cached prefix.

    Args:
        prefix_cache: the cache of `target_forward(..., use_cache=True)` over the sequences (length T). It is
            extended by this call; do not reuse it afterwards.
        block_ids (`(b, A, B)`): `[x_a, d_1 .. d_{B-1}]` per anchor.
        anchors (`(b, A)`): anchor positions.

    Returns states shaped `(b, A, B, ...)`. Row j of block k equals the target's state at position `a_k + j` after
    a plain forward over `x_{<=a_k} + d_1 .. d_j` (up to floating-point reassociation).
    """
    batch, num_blocks, size = block_ids.shape
    packed = PackedBlocks(anchors=anchors, block_size=size, context_length=prefix_cache.get_seq_length())
    dtype = next(target.parameters()).dtype
    outputs = target(
        input_ids=block_ids.flatten(1),
        position_ids=packed.block_position_ids(),
        attention_mask=verify_attention_mask(target, packed, dtype),
        **{CACHE_ARGUMENT: prefix_cache},
        use_cache=True,
        output_hidden_states=_requested_layers(target, target_layer_ids, with_last_hidden_state),
        logits_to_keep=1,
    )
    features = gather_target_features(outputs.hidden_states, target_layer_ids)
    last = outputs.hidden_states[-1] if with_last_hidden_state else None
    shape = (batch, num_blocks, size, -1)
    return TargetStates(features.view(shape), None if last is None else last.view(shape))


def target_logits(target: PreTrainedModel, last_hidden_state: torch.Tensor) -> torch.Tensor:
    """The target's next-token logits from final-norm states (with its logit soft-capping, if any)."""
    head = target.get_output_embeddings()
    logits = head(last_hidden_state.to(head.weight.dtype)).float()
    cap = getattr(target.config.get_text_config(), "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


__all__ = [
    "SUPPORTED_ATTENTION",
    "TargetStates",
    "check_target_attention",
    "parallel_verify",
    "target_forward",
    "target_logits",
    "verify_attention_mask",
]
