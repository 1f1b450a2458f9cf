"""The Carryover drafter: a DFlash-style block-diffusion drafter that can also read carried (rejected) target states.

A proposal is one forward pass over a block `[anchor, MASK x (B-1)]`. Every drafter layer attends from the block rows
to the key/value rows

    [ context rows (cached) ; carry rows (this proposal only) ; block rows ]

where context rows are the fused target states of committed tokens, and carry rows are the fused target states of the
previous round's rejected draft tokens plus the learned vector `E_carry`. Context and carry rows only feed `k_proj` and
`v_proj`; they skip the query, output projection and MLP. Attention is not causal inside the block.

The drafter shares the target's input embedding and LM head and stores neither.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    eager_attention_forward,
    rotate_half,
)
from transformers.utils import ModelOutput

from .configuration_carryover import CarryoverDrafterConfig


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of `x` (b, heads, n, head_dim) with `cos`/`sin` (b, n, head_dim)."""
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return x * cos + rotate_half(x) * sin


class CarryoverDrafterAttention(nn.Module):
    """Queries from the block rows; keys/values from `[context ; carry ; block]` rows. Not causal."""

    def __init__(self, config: CarryoverDrafterConfig, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.is_causal = False
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_attention_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_attention_heads * self.head_dim, config.hidden_size, bias=bias)
        self.q_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = Qwen3RMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def key_values(
        self, rows: torch.Tensor, position_embeddings: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated keys and values of `rows` (b, n, d) -> two (b, kv_heads, n, head_dim) tensors."""
        shape = (*rows.shape[:-1], -1, self.head_dim)
        keys = self.k_norm(self.k_proj(rows).view(shape)).transpose(1, 2)
        values = self.v_proj(rows).view(shape).transpose(1, 2)
        return _rope(keys, *position_embeddings), values

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        context: torch.Tensor | None = None,
        context_position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        carry: torch.Tensor | None = None,
        carry_position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
    ) -> torch.Tensor:
        batch, q_len, _ = hidden_states.shape
        queries = self.q_proj(hidden_states).view(batch, q_len, -1, self.head_dim)
        queries = _rope(self.q_norm(queries).transpose(1, 2), *position_embeddings)

        keys, values = [], []
        if context is not None:
            ctx_k, ctx_v = self.key_values(context, context_position_embeddings)
        else:
            ctx_k = ctx_v = queries.new_zeros(batch, self.config.num_key_value_heads, 0, self.head_dim)
        if past_key_values is not None:
            # Only context rows ever enter the cache: carry and block rows are rebuilt for every proposal.
            ctx_k, ctx_v = past_key_values.update(ctx_k, ctx_v, self.layer_idx)
        keys.append(ctx_k)
        values.append(ctx_v)
        if carry is not None:
            carry_k, carry_v = self.key_values(carry, carry_position_embeddings)
            keys.append(carry_k)
            values.append(carry_v)
        block_k, block_v = self.key_values(hidden_states, position_embeddings)
        keys.append(block_k)
        values.append(block_v)

        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, _ = attention_interface(
            self,
            queries,
            torch.cat(keys, dim=2),
            torch.cat(values, dim=2),
            attention_mask,
            dropout=self.attention_dropout if self.training else 0.0,
            scaling=self.scaling,
        )
        return self.o_proj(attn_output.reshape(batch, q_len, -1).contiguous())


class CarryoverDrafterLayer(GradientCheckpointingLayer):
    """Pre-norm Qwen3-style layer. Context and carry rows enter attention as keys/values only."""

    def __init__(self, config: CarryoverDrafterConfig, layer_idx: int):
        super().__init__()
        self.self_attn = CarryoverDrafterAttention(config, layer_idx)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor, **attention_kwargs) -> torch.Tensor:
        hidden_states = hidden_states + self.self_attn(self.input_layernorm(hidden_states), **attention_kwargs)
        return hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))


class CarryoverMarkovHead(nn.Module):
    """Rank-r first-order token transition: `W2 · W1[x_{j-1}]` added to the LM-head logits of row j."""

    def __init__(self, config: CarryoverDrafterConfig):
        super().__init__()
        self.token_embedding = nn.Embedding(config.vocab_size, config.markov_rank)  # W1: V x r
        self.proj = nn.Linear(config.markov_rank, config.vocab_size, bias=False)  # W2: r -> V

    def forward(self, previous_token_ids: torch.LongTensor) -> torch.Tensor:
        return self.proj(self.token_embedding(previous_token_ids))


@dataclass
class CarryoverDrafterOutput(ModelOutput):
    """
    last_hidden_state (`torch.Tensor` of shape `(batch, block_rows, hidden_size)`): final-norm states of the block
        rows; the LM head of the target turns rows 1.. into proposal logits.
    past_key_values (`Cache`, *optional*): the context key/value cache (context rows only).
    """

    last_hidden_state: torch.Tensor | None = None
    past_key_values: Cache | None = None


class CarryoverDrafterPreTrainedModel(PreTrainedModel):
    config: CarryoverDrafterConfig
    config_class = CarryoverDrafterConfig
    base_model_prefix = "drafter"
    main_input_name = "block_embeds"
    supports_gradient_checkpointing = True
    _no_split_modules = ["CarryoverDrafterLayer"]
    _skip_keys_device_placement = ["past_key_values"]
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = False
    _supports_attention_backend = True

    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        # `transformers.initialization` leaves weights loaded from a checkpoint alone.
        if isinstance(module, CarryoverDrafterModel):
            # E_carry starts at zero: an untrained carry row is tagged like a context row.
            init.zeros_(module.carry_embedding)
        elif module is getattr(getattr(self, "markov_head", None), "proj", None):
            # W2 starts at zero (here, on the Linear itself: a module without direct parameters is skipped by
            # Transformers' init), so a fresh Markov head leaves the backbone's proposals unchanged.
            init.zeros_(module.weight)


class CarryoverDrafterModel(CarryoverDrafterPreTrainedModel):
    """Block-diffusion drafter with context fusion, a carry segment and an optional Markov head."""

    def __init__(self, config: CarryoverDrafterConfig):
        super().__init__(config)
        self.fc = nn.Linear(config.num_target_features, config.hidden_size, bias=False)  # W_fc: k*H_target -> d
        self.hidden_norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.carry_embedding = nn.Parameter(torch.zeros(config.hidden_size))  # E_carry
        self.layers = nn.ModuleList([CarryoverDrafterLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = Qwen3RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary_emb = Qwen3RotaryEmbedding(config)
        self.markov_head = CarryoverMarkovHead(config) if config.drafter_type == "markov" else None
        self.gradient_checkpointing = False
        # Filled by `target.generate(..., assistant_model=drafter)`; see `carryover_hf.generation`.
        self.last_generation_stats = None
        self.post_init()

    def can_generate(self) -> bool:  # a drafter proposes through its target, it has no `generate` of its own
        return False

    # -- the two entry points of target features -------------------------------------------------------------
    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """Context rows: `RMSNorm(W_fc f)`, (b, n, k*H_target) -> (b, n, d)."""
        return self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))

    def fuse_carry(self, features: torch.Tensor) -> torch.Tensor:
        """Carry rows: fused like context, then tagged with `E_carry`."""
        return self.fuse_context(features) + self.carry_embedding

    def proposal_logits(
        self,
        hidden_states: torch.Tensor,
        lm_head: nn.Module,
        previous_token_ids: torch.LongTensor | None = None,
    ) -> torch.Tensor:
        """Float32 logits of block rows through the target's LM head.

        With a Markov head and `previous_token_ids` (the token at the row before, e.g. teacher-forced labels in
        training), the transition term `W2 W1[x_{j-1}]` is added; at inference the generator adds it row by row.
        """
        logits = lm_head(hidden_states.to(lm_head.weight.dtype)).float()
        if self.markov_head is not None and previous_token_ids is not None:
            logits = logits + self.markov_head(previous_token_ids).float()
        return logits

    def forward(
        self,
        block_embeds: torch.Tensor,
        block_position_ids: torch.LongTensor,
        context_features: torch.Tensor | None = None,
        context_position_ids: torch.LongTensor | None = None,
        carry_features: torch.Tensor | None = None,
        carry_position_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        use_cache: bool = False,
    ) -> CarryoverDrafterOutput:
        r"""
        block_embeds (`(batch, Q, d)`): target embeddings of block rows (one block `[anchor, MASK...]`, or several
            packed blocks in training).
        block_position_ids (`(batch, Q)`): absolute positions of block rows (`anchor_pos + j`).
        context_features (`(batch, C, k * H_target)`, *optional*): fused-layer target states of rows new to the
            context; with a cache they are appended to it.
        carry_features (`(batch, R, k * H_target)`, *optional*): target states of the previous round's rejected
            rows; visible to this forward only, never cached.
        attention_mask (`(batch, 1, Q, P + C + R + Q)`, *optional*): boolean (True = visible) or additive mask over
            `[cached context ; new context ; carry ; block]`. `None` lets every block row see every row.
        """
        if use_cache and past_key_values is None:
            past_key_values = DynamicCache(config=self.config)

        hidden_states = block_embeds.to(self.fc.weight.dtype)
        position_embeddings = self.rotary_emb(hidden_states, block_position_ids)
        context = carry = context_pe = carry_pe = None
        if context_features is not None and context_features.shape[1] > 0:
            context = self.fuse_context(context_features)
            context_pe = self.rotary_emb(hidden_states, context_position_ids)
        if carry_features is not None and carry_features.shape[1] > 0:
            carry = self.fuse_carry(carry_features)
            carry_pe = self.rotary_emb(hidden_states, carry_position_ids)
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dtype == torch.bool and self.config._attn_implementation == "eager":
            attention_mask = torch.zeros_like(attention_mask, dtype=hidden_states.dtype).masked_fill(
                ~attention_mask, torch.finfo(hidden_states.dtype).min
            )

        for layer in self.layers:
            hidden_states = layer(
                hidden_states,
                position_embeddings=position_embeddings,
                context=context,
                context_position_embeddings=context_pe,
                carry=carry,
                carry_position_embeddings=carry_pe,
                attention_mask=attention_mask,
                past_key_values=past_key_values if use_cache else None,
            )
        return CarryoverDrafterOutput(last_hidden_state=self.norm(hidden_states), past_key_values=past_key_values)


__all__ = ["CarryoverDrafterModel", "CarryoverDrafterPreTrainedModel", "CarryoverDrafterOutput"]
