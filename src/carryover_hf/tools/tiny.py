"""Tiny random targets and drafters (no downloads): `carryover-hf bench --target tiny`, smoke runs and the tests.

A target is a randomly initialised decoder-only LM of a real Transformers architecture; a drafter is a randomly
initialised Carryover drafter matched to it. `carryover_hf.tools.testing` hands both on to the tests, with its fixtures.
"""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from ..configuration_carryover import CarryoverDrafterConfig
from ..modeling_carryover import CarryoverDrafterModel


TINY_ARCHITECTURES = ("llama", "qwen3", "mistral", "gemma")


def tiny_target(
    architecture: str = "llama",
    vocab_size: int = 64,
    hidden_size: int = 64,
    num_hidden_layers: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
    **overrides,
) -> PreTrainedModel:
    """A randomly initialised decoder-only LM of a real Transformers architecture, in eval mode."""
    if architecture not in TINY_ARCHITECTURES:
        raise ValueError(f"architecture must be one of {TINY_ARCHITECTURES}, got {architecture!r}")
    values = dict(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=512,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    values.update(overrides)
    config = AutoConfig.for_model(architecture, **values)
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tiny_drafter(
    target: PreTrainedModel,
    num_hidden_layers: int = 1,
    block_size: int = 4,
    drafter_type: str = "dflash",
    seed: int = 0,
    attn_implementation: str = "sdpa",
    **overrides,
) -> CarryoverDrafterModel:
    """A randomly initialised drafter matched to `target`, in the target's dtype, in eval mode.

    `E_carry` and the Markov head's W2 are drawn at random (both start at zero before training).
    """
    config = CarryoverDrafterConfig.from_target_config(
        target.config, num_hidden_layers=num_hidden_layers, block_size=block_size, drafter_type=drafter_type, **overrides
    )
    config._attn_implementation = attn_implementation
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        drafter = CarryoverDrafterModel(config)
        # Trained drafters have a non-zero E_carry and W2; random ones should too, so tests see their effect.
        torch.nn.init.normal_(drafter.carry_embedding, std=0.5)
        if drafter.markov_head is not None:
            torch.nn.init.normal_(drafter.markov_head.proj.weight, std=0.5)
    return drafter.to(target.dtype).eval()


__all__ = ["TINY_ARCHITECTURES", "tiny_drafter", "tiny_target"]
