"""The same drafter weights on Transformers' own DFlash path (`speculation_type="dflash"`), as a reference method.

Transformers 5.23 ships `MuseGlimmerAssistantModel` and `DFlashTokenCandidateGenerator`, which keep only accepted
rows. A Carryover drafter with its carry segment off computes the same function, so its backbone can be loaded into
that class and run through Transformers' code path: the inverse of the Muse import in `carryover_hf.hub.formats`.
"""

from __future__ import annotations

from transformers import PreTrainedModel

from ..modeling_carryover import CarryoverDrafterModel
from .formats import MUSE_RENAMES


class NativeDFlashUnavailable(RuntimeError):
    """This drafter cannot run on Transformers' DFlash path; the message says why."""


# Carryover tensor name -> MuseGlimmerAssistantModel name.
_TO_MUSE = {carryover: muse for muse, carryover in MUSE_RENAMES.items()}


def unsupported_reason(drafter: CarryoverDrafterModel) -> str | None:
    """Why `drafter` has no exact counterpart on Transformers' DFlash path, or `None` if it has one."""
    config = drafter.config
    if config.drafter_type != "dflash":
        return f"drafter_type={config.drafter_type!r}: Transformers' DFlash path has no Markov head"
    if config.attention_bias:
        return "attention_bias=True: MuseGlimmerAssistantModel projections have no bias"
    if config.draft_vocab_size is not None:
        return (
            f"draft_vocab_size={config.draft_vocab_size}: this drafter proposes only from its draft vocabulary, "
            f"Transformers' DFlash path from all {config.vocab_size} rows of the LM head, so their proposals differ; "
            "compare carry_off with a drafter trained without a draft vocabulary"
        )
    return None


def muse_glimmer_config(drafter: CarryoverDrafterModel):
    """The `MuseGlimmerAssistantConfig` with the drafter's layer hyperparameters (full attention, no sliding window)."""
    from transformers import MuseGlimmerAssistantConfig

    c = drafter.config
    config = MuseGlimmerAssistantConfig(
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        rope_parameters=dict(c.rope_parameters),
        max_position_embeddings=c.max_position_embeddings,
        layer_types=["full_attention"] * c.num_hidden_layers,
        hidden_act=c.hidden_act,
        attention_dropout=c.attention_dropout,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        block_size=c.block_size,
        mask_token_id=c.mask_token_id,
        target_layer_ids=list(c.target_layer_ids),
    )
    config._attn_implementation = c._attn_implementation
    return config


def to_native_dflash(drafter: CarryoverDrafterModel) -> PreTrainedModel:
    """A `MuseGlimmerAssistantModel` holding `drafter`'s backbone weights, on its device and in its dtype.

    Raises `NativeDFlashUnavailable` for drafters with no exact counterpart (Markov head, biased projections).
    """
    reason = unsupported_reason(drafter)
    if reason is not None:
        raise NativeDFlashUnavailable(reason)
    from transformers import MuseGlimmerAssistantModel

    # E_carry is only read by carry rows, which this path never has.
    state = {_TO_MUSE.get(name, name): tensor for name, tensor in drafter.state_dict().items() if name != "carry_embedding"}
    model = MuseGlimmerAssistantModel(muse_glimmer_config(drafter))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise NativeDFlashUnavailable(f"weight names do not map (missing {missing}, unexpected {unexpected})")
    model = model.to(device=drafter.device, dtype=drafter.dtype).eval()
    # Rotary frequencies are buffers outside the state dict: copy them so both paths rotate by the same angles.
    for name in ("inv_freq", "original_inv_freq"):
        if hasattr(drafter.rotary_emb, name):
            getattr(model.rotary_emb, name).copy_(getattr(drafter.rotary_emb, name))
    return model


__all__ = ["NativeDFlashUnavailable", "muse_glimmer_config", "to_native_dflash", "unsupported_reason"]
